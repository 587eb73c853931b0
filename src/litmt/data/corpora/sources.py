"""Several training sources: the main corpus's training split followed by the extra sources
of `data.extra_train` (e.g. back-translated text, optionally tagged with a leading `<BT>` on
the source side), concatenated with `datasets.concatenate_datasets`.

`load_split` reads a split (the training split with every extra source appended, tagged where
a source says so); `split_fingerprint` keys the tokenizer and token-id caches on all of them.
A tag is a sentencepiece user-defined symbol (`litmt.data.tokenization.tokenizer`), so it stays one piece.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from litmt.config import check_keys
from litmt.data.corpora.parallel import HubSpec, ParallelCorpus, short_hash
from litmt.data.directions import parse_direction
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

EXTRA_KEYS = (
    "name",
    "dir",
    "format",
    "split",
    "hub",
    "layout",
    "columns",
    "translation_column",
    "tag",
    "direction",
)


@dataclass
class TrainSource:
    """One more training source appended to the training split (`data.extra_train` entries).

    Args:
        corpus: where its pairs live (same languages as the main corpus); its `train` split
            is the file stem (local) or hub split name the entry's `split` names.
        tag: prepended, with a space, to every source line (e.g. `<BT>` for back-translated
            text); it must be a user-defined symbol of the tokenizer (`Tokenizer.encode_src`
            then encodes it as one id). None = no tag.
        name: a label for logs.
        direction: with `data.directions`, the index of the direction whose training
            split it extends (its `direction` key); 0 for one pair.
    """

    corpus: ParallelCorpus
    tag: str | None = None
    name: str = ""
    direction: int = 0

    def __post_init__(self) -> None:
        if self.tag is not None and (not self.tag or any(c.isspace() for c in self.tag)):
            raise ConfigError(
                f"data.extra_train[{self.name}].tag={self.tag!r} must be one word without "
                f"spaces, e.g. <BT>, or null"
            )


def parse_train_sources(
    entries: Any,
    *,
    src_lang: str,
    tgt_lang: str,
    resolve: Any = Path,
    hf_cache_dir: str | None = None,
    directions: list[str] | None = None,
) -> list[TrainSource]:
    """`TrainSource`s from the `data.extra_train` list of plain dicts.

    Each entry: `dir` (local folder, relative paths through `resolve`) or `hub: {path, name,
    revision}`; `format`, `layout`, `columns`, `translation_column` as for the main corpus;
    `split` (default `train`): the local file stem or hub split name; `tag`; `name`;
    `direction` (``SRC-TGT``): the direction it extends, required with `directions` (the
    names of `data.directions`), whose languages its files then have; without directions it
    may only name the pair `src_lang`-`tgt_lang`.

    Raises:
        ConfigError: an entry is not a mapping, has unknown keys, names no corpus, or names
            no direction of the model.
    """
    sources = []
    for i, entry in enumerate(entries or []):
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"data.extra_train[{i}] must be a mapping like {{dir: PATH, tag: <BT>}}, "
                f"got {entry!r}"
            )
        check_keys(entry, EXTRA_KEYS, f"data.extra_train[{i}]")
        name = str(entry.get("name") or f"extra{i}")
        split = str(entry.get("split") or "train")
        hub = dict(entry.get("hub") or {})
        check_keys(hub, ("path", "name", "revision"), f"data.extra_train[{i}].hub")
        hub["splits"] = {"train": split}
        directory = entry.get("dir")
        if directory is None and not hub.get("path"):
            raise ConfigError(f"data.extra_train[{i}] ({name}) needs dir=PATH or hub.path")
        k, src, tgt = _direction_of(i, entry, src_lang, tgt_lang, directions)
        corpus = ParallelCorpus(
            src_lang=src,
            tgt_lang=tgt,
            dir=resolve(directory) if directory is not None else None,
            format=str(entry.get("format") or "text"),
            splits={"train": split},
            hub=HubSpec(**hub),
            layout=str(entry.get("layout") or "columns"),
            columns=dict(entry["columns"]) if entry.get("columns") else None,
            translation_column=str(entry.get("translation_column") or "translation"),
            hf_cache_dir=hf_cache_dir,
        )
        tag = entry.get("tag")
        sources.append(TrainSource(corpus, None if tag is None else str(tag), name, k))
    return sources


def _direction_of(
    i: int, entry: Mapping, src_lang: str, tgt_lang: str, directions: list[str] | None
) -> tuple[int, str, str]:
    """(direction index, source language, target language) of extra_train entry `i`."""
    names = directions or [f"{src_lang}-{tgt_lang}"]
    given = entry.get("direction")
    if given is None and directions:
        raise ConfigError(
            f"data.extra_train[{i}] needs direction=SRC-TGT with data.directions, one of "
            f"{', '.join(names)}"
        )
    if given is None:
        return 0, src_lang, tgt_lang
    d = parse_direction(given)  # en-de, en_de, [en, de]: as data.directions reads them
    if d.name not in names:
        what = "data.directions" if directions else "the pair this model trains"
        raise ConfigError(
            f"data.extra_train[{i}].direction={given} is not one of {what}: {', '.join(names)}"
        )
    return names.index(d.name), d.src, d.tgt


def source_tags(sources: list[TrainSource]) -> list[str]:
    """The distinct tags of `sources`, in order of first use."""
    return list(dict.fromkeys(s.tag for s in sources if s.tag is not None))


def split_fingerprint(main: ParallelCorpus, sources: list[TrainSource], split: str) -> str:
    """`main.fingerprint(split)`; for the training split with extra sources, a key of every
    source's content and tag as well (the cache keys change when any of them does)."""
    fp = main.fingerprint(split)
    if split != "train" or not sources:
        return fp
    return short_hash(fp, *((s.corpus.fingerprint("train"), s.tag) for s in sources))


def _tagged(ds: datasets.Dataset, tag: str) -> datasets.Dataset:
    prefix = tag + " "

    def add(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
        # empty lines stay empty, so that the training filter still drops them
        return {"src": [prefix + s if s else "" for s in batch["src"]]}

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one bar per source would flood the training log
    try:
        return ds.map(add, batched=True)
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def load_split(main: ParallelCorpus, sources: list[TrainSource], split: str) -> datasets.Dataset:
    """`main.load(split)`; the training split is followed by every extra source's pairs
    (`datasets.concatenate_datasets`, in config order), tagged where the source says so.

    Example index i of the result is pair i of the main corpus for i < len(main), then the
    first extra source's pairs, and so on.
    """
    ds = main.load(split)
    if split != "train" or not sources:
        return ds
    parts, sizes = [ds], [f"main {len(ds)}"]
    for s in sources:
        extra = s.corpus.load("train")
        if s.tag is not None:
            extra = _tagged(extra, s.tag)
        parts.append(extra)
        sizes.append(f"{s.name} {len(extra)}" + (f" (tagged {s.tag})" if s.tag else ""))
    log.info("training sources: %s pairs", ", ".join(sizes))
    return datasets.concatenate_datasets(parts)
