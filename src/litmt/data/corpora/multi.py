"""The splits of a multilingual corpus (`data.directions`): one `ParallelCorpus` per
direction over the same files, concatenated in config order and tagged with the target
language (`litmt.data.directions`), and the temperature-sampled training examples.

A direction's training split is its corpus's, followed by the `data.extra_train` sources
whose `direction` names it (`litmt.data.corpora.sources`: their own tags first, then the language
tag), so temperature sampling counts them in that direction's size.

`MultiCorpus` implements `litmt.data.corpora.interface.Corpora` (what the DataModule reads) as
`PairCorpora` does for one direction: it streams, loads, counts and fingerprints a split
direction after direction, and answers the per-direction questions (spans, forced prefixes,
languages). `ResampledPairs` is a view of the prepared training pairs with each direction
repeated or subsampled (`sampled_positions`), drawn again every epoch (`TemperatureDraw`,
a pure function of (data.seed, epoch)), which the token-budget sampler reads like any
`TokenizedPairs` (no copy of the token ids; `at_epoch` gives the lengths it plans an epoch
on, `set_epoch` the items the DataLoader serves). `open_corpora` builds the one or the other from
the data settings.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from litmt.data.batching.collate import Example, TokenizedPairs
from litmt.data.config import DataConfig, resolve_path
from litmt.data.corpora.interface import Corpora, PairCorpora
from litmt.data.corpora.parallel import ParallelCorpus, short_hash
from litmt.data.corpora.sources import (
    TrainSource,
    load_split,
    parse_train_sources,
    source_tags,
    split_fingerprint,
)
from litmt.data.corpora.streams import Chunk, count_pairs, pair_chunks
from litmt.data.directions import (
    Direction,
    direction_of,
    lang_tag,
    parse_directions,
    sampled_positions,
)

if TYPE_CHECKING:
    from litmt.data.tokenization.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def _tag(tag: str, texts: list[str]) -> list[str]:
    # empty lines stay empty, so that the training filter still drops them
    return [f"{tag} {t}" if t else "" for t in texts]


@dataclass
class MultiCorpus(Corpora):
    """Every direction's corpus, tagged by `placement` (``source`` or ``target``)."""

    directions: list[Direction]
    corpora: list[ParallelCorpus]  # one per direction, same order
    placement: str = "source"
    extra: list[TrainSource] = field(default_factory=list)  # each with its direction index
    _offsets: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False)

    @property
    def main(self) -> ParallelCorpus:
        """The first direction's corpus: its languages are the model's src_lang/tgt_lang."""
        return self.corpora[0]

    def _extra(self, k: int) -> list[TrainSource]:
        """The extra training sources of direction `k`, in config order."""
        return [s for s in self.extra if s.direction == k]

    def fingerprint(self, split: str) -> str:
        """A cache key of every direction's content (extra sources included) and the tag
        placement."""
        parts = [
            (d.name, split_fingerprint(c, self._extra(k), split))
            for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True))
        ]
        return short_hash("multi", self.placement, *parts)

    def _tagged(self, d: Direction, src: list[str], tgt: list[str]) -> Chunk:
        if self.placement == "source":
            return _tag(d.tag, src), tgt
        return src, _tag(d.tag, tgt)

    def chunks(self, split: str, limit: int | None = None) -> Iterator[Chunk]:
        """The tagged pairs of `split`, direction after direction (`limit`: per direction,
        extra sources included)."""
        for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True)):
            for src, tgt in pair_chunks(c, self._extra(k), split, limit=limit):
                yield self._tagged(d, src, tgt)

    def sizes(self, split: str, limit: int | None = None) -> list[int]:
        """Pairs per direction in `split` (before filtering; `limit` per direction)."""
        out = []
        for k, c in enumerate(self.corpora):
            n = count_pairs(c, self._extra(k), split)
            if n is None:  # hub tables: count by loading (Arrow, memory-mapped)
                n = len(load_split(c, self._extra(k), split))
            out.append(n if limit is None else min(n, limit))
        return out

    def count(self, split: str, limit: int | None = None) -> int:
        """Pairs of every direction in `split` (before filtering; `limit` per direction)."""
        return sum(self.sizes(split, limit))

    def offsets(self, split: str, limit: int | None = None) -> list[int]:
        """(D+1,) start of each direction's example indices in `split`, then the total."""
        return [0, *np.cumsum(self.sizes(split, limit)).tolist()]

    def load(self, split: str, limit: int | None = None) -> datasets.Dataset:
        """The split's text (`src`, `tgt`): references keep their plain target text; with
        ``source`` placement, sources carry their tag (what the model reads)."""
        parts = []
        for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True)):
            ds = load_split(c, self._extra(k), split)
            if limit is not None:
                ds = ds.select(range(min(limit, len(ds))))
            src = [s or "" for s in ds["src"]]
            if self.placement == "source":
                src = _tag(d.tag, src)
            parts.append(datasets.Dataset.from_dict({"src": src, "tgt": list(ds["tgt"])}))
        return datasets.concatenate_datasets(parts)

    def resample(
        self, pairs: TokenizedPairs, temperature: float, seed: int, limit: int | None
    ) -> TokenizedPairs:
        """The training pairs sampled across directions at `temperature` (`resample`)."""
        return resample(pairs, self.offsets("train", limit), self.directions, temperature, seed)

    def direction_spans(self, split: str) -> list[tuple[str, int, int]]:
        """Per direction, (``en-de``, first, end) example indices of `split` (valid, test),
        for per-direction scores; counted once (valid is decoded every epoch)."""
        if split not in self._offsets:
            self._offsets[split] = self.offsets(split)
        offsets = self._offsets[split]
        return [(d.name, offsets[k], offsets[k + 1]) for k, d in enumerate(self.directions)]

    def forced_prefixes(
        self, split: str, indices: Sequence[int], tokenizer: Callable[[], Tokenizer]
    ) -> list[list[int]] | None:
        """The language token of each example's direction with ``target`` placement; None
        with ``source`` placement (the tag is in the source text)."""
        if self.placement != "target":
            return None
        tags = tokenizer().tgt_tags
        spans = self.direction_spans(split)
        which = direction_of([0, *(end for _, _, end in spans)], np.asarray(indices))
        return [[tags[self.directions[int(k)].tag]] for k in which]

    def languages_meta(self) -> dict[str, Any]:
        """The directions and the tag placement (a checkpoint records them)."""
        return {"directions": [d.name for d in self.directions], "tag_placement": self.placement}

    def scored(self) -> list[ParallelCorpus]:
        """One corpus per direction, each scored with its language token."""
        return list(self.corpora)

    def tags(self) -> list[str]:
        """The extra sources' tags, then each target language's token."""
        langs = [lang_tag(d.tgt) for d in self.directions]
        return list(dict.fromkeys([*source_tags(self.extra), *langs]))


@dataclass(frozen=True)
class TemperatureDraw:
    """epoch -> (M,) positions of the epoch's training examples (`sampled_positions`); M is
    the same for every epoch. A picklable callable (DataLoader workers may be spawned)."""

    groups: tuple[np.ndarray, ...]  # per direction, (n_i,) positions of its pairs
    temperature: float
    seed: int

    def __call__(self, epoch: int) -> np.ndarray:
        return sampled_positions(self.groups, self.temperature, self.seed, epoch)[0]


class ResampledPairs(TokenizedPairs):
    """`base`'s examples at the positions `draw(epoch)` (repeats allowed), sharing its arrays.

    Args:
        base: the prepared training pairs.
        draw: epoch -> (M,) positions into `base`, M the same for every epoch.
        epoch: the epoch whose draw the view starts with (`set_epoch` changes it).
    """

    def __init__(
        self, base: TokenizedPairs, draw: Callable[[int], np.ndarray], epoch: int = 0
    ) -> None:
        self.__dict__.update(base.__dict__)
        self.base, self.draw = base, draw
        self.redrawn_per_epoch = True  # the loader plans each epoch on its own lengths
        self.epoch = -1
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Serve `epoch`'s draw (the DataLoader calls this before it starts its workers)."""
        if int(epoch) == self.epoch:
            return
        self.epoch = int(epoch)
        self.positions = np.asarray(self.draw(self.epoch), dtype=np.int64)  # (M,)
        self.indices = self.base.indices[self.positions]  # (M,)

    def at_epoch(self, epoch: int) -> ResampledPairs:
        """A view of `epoch`'s draw (what the batch sampler plans that epoch on)."""
        return ResampledPairs(self.base, self.draw, epoch)

    def src_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) source tensor lengths of positions start:stop (as `TokenizedPairs`)."""
        return self.base.src_lengths_at(self.positions[start:stop])  # not all of base's

    def tgt_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) target tensor lengths of positions start:stop (as `TokenizedPairs`)."""
        return self.base.tgt_lengths_at(self.positions[start:stop])

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, pos: int) -> Example:
        return self.base[int(self.positions[pos])]


def _share(name: str, n: int, want: int) -> str:
    """One direction's part of the setup log line."""
    whole, rest = divmod(want, n) if n else (0, 0)
    text = f"{name} {n} pairs -> {want} examples"
    if rest and not whole:  # `epoch_subset`: every pair within ceil(n / rest) epochs
        text += f" (a new subset each epoch, every pair within {-(-n // rest)} epochs)"
    elif rest:
        text += f" (every pair x{whole}, plus a new {rest} each epoch)"
    return text


def resample(
    pairs: TokenizedPairs,
    offsets: list[int],
    directions: list[Direction],
    temperature: float,
    seed: int,
) -> TokenizedPairs:
    """Temperature-sampled training pairs, drawn again every epoch (`TemperatureDraw`); at
    T=1 `pairs` itself (the corpus proportions)."""
    which = direction_of(offsets, pairs.indices)  # (N,) direction of each kept pair
    groups = tuple(np.flatnonzero(which == k) for k in range(len(directions)))
    if temperature == 1.0:
        counts = [len(g) for g in groups]
        log.info(
            "directions (T=1, proportional): %s",
            ", ".join(f"{d.name} {n}" for d, n in zip(directions, counts, strict=True)),
        )
        return pairs
    draw = TemperatureDraw(groups, float(temperature), int(seed))
    _, counts = sampled_positions(groups, temperature, seed)
    log.info(
        "directions (T=%g, subsets drawn again every epoch): %s",
        temperature,
        ", ".join(
            _share(d.name, len(g), n) for d, g, n in zip(directions, groups, counts, strict=True)
        ),
    )
    return ResampledPairs(pairs, draw)


def open_corpora(cfg: DataConfig, hf_cache_dir: Path) -> Corpora:
    """The corpora `cfg` names: one pair, or one corpus per direction over the same files
    (a direction may name its own folder and split stems)."""
    main = ParallelCorpus(
        src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang,
        dir=resolve_path(cfg.dir) if cfg.dir is not None else None, format=cfg.format,
        splits=dataclasses.asdict(cfg.splits), hub=cfg.hub.spec(), layout=cfg.layout,
        columns=cfg.columns, translation_column=cfg.translation_column,
        hf_cache_dir=str(hf_cache_dir),
    )  # fmt: skip
    directions = parse_directions(cfg.directions)
    extra = parse_train_sources(
        cfg.extra_train, src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang, resolve=resolve_path,
        hf_cache_dir=str(hf_cache_dir), directions=[d.name for d in directions] or None,
    )  # fmt: skip
    if not directions:
        return PairCorpora(main, extra)
    corpora = [
        dataclasses.replace(
            main, src_lang=d.src, tgt_lang=d.tgt,
            dir=resolve_path(d.dir) if d.dir is not None else main.dir,
            splits={**main.splits, **dict(d.splits)},
        )
        for d in directions
    ]  # fmt: skip
    return MultiCorpus(directions, corpora, cfg.tag_placement, extra=extra)


__all__ = ["MultiCorpus", "ResampledPairs", "TemperatureDraw", "open_corpora", "resample"]
