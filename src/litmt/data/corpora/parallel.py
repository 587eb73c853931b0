"""Parallel corpora as `datasets.Dataset`s with two string columns, `src` and `tgt`.

Sources (chosen by `ParallelCorpus(dir=..., format=...)`):
- the Hugging Face hub (`dir=None`): `datasets.load_dataset(hub.path, hub.name, split=...)`;
- local plain text (`format="text"`): `{dir}/{split}.{lang}`, one sentence per line, the
  fairseq/OpenNMT convention; a split may be several shards, read in order: a list of
  stems, or a glob such as `train.*` (shards `train.00.en`, `train.01.en`, ... sorted by name);
- local tables (`format="tsv" | "jsonl" | "parquet"`): `{dir}/{split}.{tsv,jsonl,parquet}`
  (a TSV has a header row naming its columns).

Tables (hub and local) have a layout: `translation` (one dict column `{lang: text}`, as in
wmt14/iwslt2017) or `columns` (one column per language, as in bentrevett/multi30k; the
column of a language is `columns[lang]`, default the language code itself).

Every user mistake raises a one-line `DataError` naming the file and the fix.

Several training sources (`data.extra_train`) are `litmt.data.corpora.sources`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from litmt.data.text import read_text_file
from litmt.errors import ConfigError, DataError

FORMATS = ("text", "tsv", "jsonl", "parquet")
LAYOUTS = ("translation", "columns")
SPLITS = ("train", "valid", "test")
_EXT = {"tsv": "tsv", "jsonl": "jsonl", "parquet": "parquet"}


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def short_hash(*parts: object, n: int = 16) -> str:
    """Hex digest of the parts' reprs (cache keys)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:n]


@dataclass
class HubSpec:
    """Where a corpus lives on the Hugging Face hub (`data.hub` in the configs)."""

    path: str | None = None  # dataset repository, e.g. wmt14 or bentrevett/multi30k
    name: str | None = None  # dataset config, e.g. de-en (None = the default config)
    revision: str | None = None  # git revision of the dataset repo (None = main)
    splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"}
    )  # our split -> hub split name
    streaming: bool = False  # refused: training reads the prepared memory-mapped cache

    def __post_init__(self) -> None:
        if self.streaming:
            raise ConfigError(
                "data.hub.streaming=true is not supported: the token-budget sampler needs every "
                "pair's length before the first batch (bucketing, equal DDP batch counts, exact "
                "resume), so litmt prepares a memory-mapped cache once, reading the hub's Arrow "
                "files in chunks; set data.hub.streaming=false"
            )


@dataclass
class ParallelCorpus:
    """A parallel corpus in one language direction.

    Args:
        src_lang, tgt_lang: language codes (file suffixes, column names or dict keys).
        dir: local directory; None = the hub.
        format: local format, one of `FORMATS`.
        splits: our split (`train`/`valid`/`test`) -> local file stem; for text, also a
            list of stems or a glob (`train.*`): shards read in (sorted) order.
        hub: where the hub copy lives (used when `dir` is None).
        layout: table layout, `translation` or `columns`.
        columns: language -> column name for the `columns` layout (default: the code).
        translation_column: the dict column of the `translation` layout.
        hf_cache_dir: where `datasets` keeps its own caches (None = its default).
    """

    src_lang: str
    tgt_lang: str
    dir: str | Path | None = None
    format: str = "text"
    splits: dict[str, Any] = field(
        default_factory=lambda: {"train": "train", "valid": "valid", "test": "test"}
    )
    hub: HubSpec = field(default_factory=HubSpec)
    layout: str = "columns"
    columns: dict[str, str] | None = None
    translation_column: str = "translation"
    hf_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.hub, Mapping):
            self.hub = HubSpec(**dict(self.hub))
        if self.format not in FORMATS:
            raise ConfigError(f"unknown data.format {self.format!r}; choose one of {FORMATS}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown data.layout {self.layout!r}; choose one of {LAYOUTS}")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        if self.dir is None and not self.hub.path:
            raise ConfigError("no corpus: set data.dir=PATH (local files) or data.hub.path")
        if self.dir is not None:
            self.dir = Path(self.dir)
            if not self.dir.is_dir():
                raise DataError(
                    f"data directory {self.dir} does not exist; set data.dir to the folder "
                    f"holding {{split}}.{{lang}} files"
                )

    # -- naming -------------------------------------------------------------------------
    def with_split(self, name: str) -> ParallelCorpus:
        """A copy whose split `name` reads the file stem (local) or hub split `name`: how an
        extra test set such as ``test_2017_flickr`` (`data.extra_test`) is loaded."""
        if self.is_local:
            return dataclasses.replace(self, splits={**self.splits, name: name})
        hub = dataclasses.replace(self.hub, splits={**self.hub.splits, name: name})
        return dataclasses.replace(self, hub=hub)

    @property
    def is_local(self) -> bool:
        return self.dir is not None

    def split_name(self, split: str) -> Any:
        """The file stem(s) (local) or hub split name of our split `train`/`valid`/`test`."""
        table = self.splits if self.is_local else self.hub.splits
        key = "splits" if self.is_local else "hub.splits"
        if split not in table or not table[split]:
            raise ConfigError(f"no {split!r} split configured; set data.{key}.{split}=NAME")
        return table[split]

    def shards(self, split: str) -> list[tuple[Path, Path]]:
        """The (source, target) files of a text split, in reading order.

        Raises:
            DataError: a glob matches no source file.
        """
        assert self.dir is not None
        names = self.split_name(split)
        stems = [str(n) for n in names] if isinstance(names, list | tuple) else [str(names)]
        if len(stems) == 1 and any(c in stems[0] for c in "*?["):
            suffix = f".{self.src_lang}"
            found = sorted(self.dir.glob(stems[0] + suffix))
            if not found:
                raise DataError(
                    f"no files match {self.dir}/{stems[0]}{suffix} for the {split!r} split; "
                    f"set data.splits.{split} to a stem, a list of stems or a glob like train.*"
                )
            stems = [f.name[: -len(suffix)] for f in found]
        d, s, t = self.dir, self.src_lang, self.tgt_lang
        return [(d / f"{stem}.{s}", d / f"{stem}.{t}") for stem in stems]

    def files(self, split: str) -> list[Path]:
        """The local files of `split` (text: source then target of every shard)."""
        assert self.dir is not None
        if self.format == "text":
            return [f for pair in self.shards(split) for f in pair]
        return [self.dir / f"{self.split_name(split)}.{_EXT[self.format]}"]

    def _check_files(self, split: str) -> list[Path]:
        files = self.files(split)
        for f in files:
            if not f.is_file():
                hint = (
                    f"set data.splits.{split}=STEM so that {self.dir}/STEM.{self.src_lang} and "
                    f"STEM.{self.tgt_lang} exist"
                    if self.format == "text"
                    else f"set data.splits.{split}=STEM for {self.dir}/STEM.{_EXT[self.format]}"
                )
                raise DataError(f"missing file {f} for the {split!r} split; {hint}")
        return files

    def fingerprint(self, split: str) -> str:
        """A key that changes when the split's content may have changed.

        Local: paths, sizes and modification times (no reading). Hub: the path, config,
        revision and split name (the hub copy is immutable per revision).
        """
        if self.is_local:
            files = self._check_files(split)
            parts: tuple[Any, ...] = (self.format, self.layout, self.src_lang, self.tgt_lang)
            return short_hash(*parts, self._column_keys(), *(_stat_key(f) for f in files))
        h = self.hub
        return short_hash(
            "hub", h.path, h.name, h.revision, self.split_name(split), self.layout,
            self._column_keys(), self.src_lang, self.tgt_lang,
        )  # fmt: skip

    def _column_keys(self) -> tuple[str, ...]:
        if self.layout == "translation":
            return (self.translation_column,)
        cols = self.columns or {}
        return (cols.get(self.src_lang, self.src_lang), cols.get(self.tgt_lang, self.tgt_lang))

    # -- loading ------------------------------------------------------------------------
    def load(self, split: str) -> datasets.Dataset:
        """The split as a Dataset with string columns `src` and `tgt` (in file order)."""
        if self.is_local and self.format == "text":
            ds = self._load_text(split)
        elif self.is_local:
            ds = self._from_table(self._load_local_table(split), str(self.files(split)[0]))
        else:
            ds = self._from_table(self._load_hub(split), self._hub_label(split))
        if len(ds) == 0:
            where = self.files(split)[0] if self.is_local else self._hub_label(split)
            raise DataError(f"the {split!r} split ({where}) is empty; point data at a real corpus")
        return ds

    def _load_text(self, split: str) -> datasets.Dataset:
        """All shards in memory: for valid/test and `references`; training streams
        (`litmt.data.corpora.streams`)."""
        self._check_files(split)
        src_all: list[str] = []
        tgt_all: list[str] = []
        for src_file, tgt_file in self.shards(split):
            src = read_text_file(src_file, "corpus file", strict=True)
            tgt = read_text_file(tgt_file, "corpus file", strict=True)
            if len(src) != len(tgt):
                raise DataError(
                    f"{src_file} has {len(src)} lines but {tgt_file} has {len(tgt)}; the two "
                    f"sides of a parallel corpus must align line by line"
                )
            src_all += src
            tgt_all += tgt
        if not src_all:
            src_file, tgt_file = self.shards(split)[0]
            raise DataError(f"{src_file} and {tgt_file} are empty; point data at a real corpus")
        return datasets.Dataset.from_dict({"src": src_all, "tgt": tgt_all})

    def _load_local_table(self, split: str) -> datasets.Dataset:
        (path,) = self._check_files(split)
        if self.format == "tsv":
            lines = read_text_file(path, "corpus file", strict=True)
            if not lines:
                raise DataError(f"{path} is empty; a TSV needs a header row and data rows")
            header = lines[0].split("\t")
            rows = [ln.split("\t") for ln in lines[1:]]
            for i, row in enumerate(rows, start=2):
                if len(row) != len(header):
                    raise DataError(
                        f"{path}: line {i} has {len(row)} tab-separated fields but the header "
                        f"has {len(header)}; remove stray tabs or quote nothing"
                    )
            return datasets.Dataset.from_dict(
                {h: [r[j] for r in rows] for j, h in enumerate(header)}
            )
        builder = "json" if self.format == "jsonl" else "parquet"
        try:
            return datasets.load_dataset(
                builder, data_files=str(path), split="train", cache_dir=self.hf_cache_dir
            )
        except Exception as exc:  # pyarrow/json parse errors have many types
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(f"cannot read {path} as {self.format}: {msg}") from exc

    def _hub_label(self, split: str) -> str:
        name = f" ({self.hub.name})" if self.hub.name else ""
        return f"hub dataset {self.hub.path}{name} split {self.split_name(split)!r}"

    def _load_hub(self, split: str) -> datasets.Dataset:
        h, name = self.hub, self.split_name(split)
        local_hint = (
            f"or use local files: data.dir=PATH with {{split}}.{self.src_lang} / "
            f"{{split}}.{self.tgt_lang} text files (e.g. data.dir=../shared/data/multi30k)"
        )
        try:
            return datasets.load_dataset(
                h.path, h.name, split=name, revision=h.revision, cache_dir=self.hf_cache_dir
            )
        except ValueError as exc:
            if "split" in str(exc).lower():
                raise DataError(
                    f"hub dataset {h.path} has no split {name!r} ({str(exc).splitlines()[0]}); "
                    f"set data.hub.splits.{split}=NAME"
                ) from None
            raise
        except (ConnectionError, OSError) as exc:
            offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
            if isinstance(exc, datasets.exceptions.DatasetNotFoundError) and not offline:
                raise DataError(
                    f"hub dataset {h.path!r} not found; check data.hub.path, {local_hint}"
                ) from None
            why = "offline mode is on" if offline else "the hub cannot be reached"
            raise DataError(
                f"hub dataset {h.path}{f' ({h.name})' if h.name else ''} is not in the local "
                f"cache and {why}; download it once with network access, {local_hint}"
            ) from None

    def _from_table(self, ds: datasets.Dataset, where: str) -> datasets.Dataset:
        """Select/rename to `src`/`tgt` according to the layout."""
        if self.layout == "translation":
            col = self.translation_column
            if col not in ds.column_names:
                raise DataError(
                    f"{where}: no column {col!r} (columns: {', '.join(ds.column_names)}); set "
                    f"data.translation_column, or data.layout=columns for one column per language"
                )
            feature = ds.features[col]
            langs = list(getattr(feature, "languages", None) or {})
            if not langs and len(ds):
                langs = list(ds[0][col] or {})
            for lang in (self.src_lang, self.tgt_lang):
                if lang not in langs:
                    raise DataError(
                        f"{where}: language {lang!r} not in column {col!r} (languages: "
                        f"{', '.join(map(str, langs))}); set data.src_lang/data.tgt_lang"
                    )
            src_lang, tgt_lang = self.src_lang, self.tgt_lang

            def pick(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
                rows = batch[col]
                return {"src": [r[src_lang] for r in rows], "tgt": [r[tgt_lang] for r in rows]}

            return ds.map(pick, batched=True, remove_columns=ds.column_names)
        src_col, tgt_col = self._column_keys()
        for lang, c in ((self.src_lang, src_col), (self.tgt_lang, tgt_col)):
            if c not in ds.column_names:
                raise DataError(
                    f"{where}: no column {c!r} for language {lang!r} (columns: "
                    f"{', '.join(ds.column_names)}); set data.columns.{lang}=COLUMN or "
                    f"data.layout=translation"
                )
        ds = ds.select_columns([src_col, tgt_col])
        if (src_col, tgt_col) != ("src", "tgt"):
            ds = ds.rename_columns({src_col: "__s", tgt_col: "__t"})
            ds = ds.rename_columns({"__s": "src", "__t": "tgt"})
        return ds
