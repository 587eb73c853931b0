"""`DataConfig`: every data setting (a key of `conf/data/*.yaml`), defined once.

Each field carries its default and, on the line under it, its one documentation.
`conf/data/base.yaml` lists every key set to its real default with that docstring as its
comment (`litmt.config.render_yaml`); the corpus files (`multi30k.yaml`, ...) inherit it and
set only their differences. `tests/unit/test_config_defaults.py` fails when the base
YAML drifts from these fields.

Null always means the default. A setting that can be switched off spells "off" with a value:
``max_tokens: 0`` (batches by sentence count), ``max_positions: 0`` (no truncation),
``filter.max_ratio: .inf`` (no ratio filter).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litmt.config import build, plain
from litmt.data.corpora.parallel import HubSpec
from litmt.data.directions import check_placement, sampling_weights
from litmt.data.preparation.encoding import FilterConfig
from litmt.data.tokenization.tokenizer import TokenizerConfig
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """Relative paths are relative to the original working dir (Hydra's, if it runs)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.utils import to_absolute_path

        if HydraConfig.initialized():
            return Path(to_absolute_path(str(path)))
    except ImportError:  # pragma: no cover - hydra is a dependency, but keep data usable alone
        pass
    return Path(path)


@dataclass
class SplitNames:
    """Our split -> its local file stem(s) (`data.splits`)."""

    train: Any = "train"
    """training split; also a list of stems or a glob (train.* = shards train.00.{lang}, ...,
    read in name order)"""
    valid: Any = "valid"
    """validation split (never filtered)"""
    test: Any = "test"
    """test split (never filtered)"""


@dataclass
class HubSplitNames:
    """Our split -> its split name on the hub (`data.hub.splits`)."""

    train: str = "train"
    """training split on the hub"""
    valid: str = "validation"
    """validation split on the hub"""
    test: str = "test"
    """test split on the hub"""


@dataclass
class HubConfig:
    """Where the hub copy of a corpus lives (`data.hub`); `spec()` is what the corpus reads."""

    path: str | None = None
    """dataset repository, e.g. bentrevett/multi30k"""
    name: str | None = None
    """dataset config, e.g. de-en (null = the default config)"""
    revision: str | None = None
    """dataset git revision (null = main)"""
    streaming: bool = False
    """must stay false: training reads the prepared memory-mapped cache (true is refused with
    the reason)"""
    splits: HubSplitNames = field(default_factory=HubSplitNames)
    """hub split names per split"""

    def spec(self) -> HubSpec:
        """The `HubSpec` a `ParallelCorpus` reads (refuses ``streaming``)."""
        names = dataclasses.asdict(self.splits)
        return HubSpec(self.path, self.name, self.revision, names, self.streaming)


@dataclass
class DataConfig:
    """Every data setting (`conf/data/*.yaml`), with the one set of defaults; what
    `litmt.data.datamodule.TranslationDataModule` is built from."""

    name: str = "corpus"
    """corpus name, used in cache keys (tokenizer and token-id caches)"""
    src_lang: str = "en"
    """source language (file suffix / column / translation key)"""
    tgt_lang: str = "de"
    """target language"""
    dir: str | None = None
    """null = the hub; a path = local files {dir}/{split}.{lang} (relative to the launch dir)"""
    format: str = "text"
    """local files: text ({split}.{lang}) | tsv | jsonl | parquet ({split}.{ext})"""
    splits: SplitNames = field(default_factory=SplitNames)
    """local file stems per split (the hub uses hub.splits)"""
    hub: HubConfig = field(default_factory=HubConfig)
    """where the hub copy lives (used when dir is null)"""
    layout: str = "columns"
    """tables: columns (one column per language) | translation (one dict column)"""
    columns: dict[str, str] | None = None
    """language -> column name for layout=columns (null = the language code)"""
    translation_column: str = "translation"
    """the dict column for layout=translation"""
    extra_train: list[Any] = field(default_factory=list)
    """more training sources appended to train, each {name, dir, split, format, tag,
    direction}, e.g. [{name: bt, dir: data/bt, split: train, tag: "<BT>"}]
    (docs/guide/train.md#back-translation-recipe); direction: en-fr = the direction it
    extends (required with directions)"""
    directions: list[Any] = field(default_factory=list)
    """several directions in one model, e.g. [en-de, en-fr, en-cs] (or {pair: en-fr, dir:
    PATH} with its own corpus); [] = src_lang→tgt_lang only
    (docs/guide/train.md#many-languages-in-one-model)"""
    tag_placement: str = "source"
    """where the target-language token <2xx> goes: source (prefixed to the source) | target
    (forced as the first target token)"""
    sampling_temperature: float = 1.0
    """sampling across directions: p_i ∝ n_i^(1/T); 1 = proportional to corpus size, .inf =
    uniform; a downsampled direction gets a new subset every epoch (a function of seed and
    epoch: the same on resume and every DDP rank), each pair seen within ceil(n_i / subset)
    epochs"""
    extra_test: list[str] = field(default_factory=list)
    """more test splits scored at the end of training (finalize), e.g. [test_2017_flickr,
    test_2018_flickr, test_2017_mscoco] (local file stems or hub split names); absent ones are
    skipped with a warning; they never choose anything"""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """sentencepiece, trained on the training split and cached"""
    cache_dir: str = "data"
    """tokenizers/ and cache/ (memory-mapped token ids, one copy per node shared by its
    ranks) live here"""
    max_tokens: int = 4096
    """train batch budget in tokens, padding included; 0 = none (batches of batch_size
    sentences)"""
    batch_size: int | None = None
    """sentences per train batch with max_tokens=0 (else an extra cap); null = no cap"""
    eval_max_tokens: int = 8192
    """valid/test batch budget in tokens; 0 = none (batches of eval_batch_size sentences)"""
    eval_batch_size: int | None = None
    """valid/test sentences per batch with eval_max_tokens=0 (else an extra cap); null =
    batch_size"""
    filter: FilterConfig = field(default_factory=FilterConfig)
    """training split only; counts are logged"""
    bucket_pool: int | None = None
    """sort by length within pools of this many batches (null = whole split: constant batch
    count)"""
    max_positions: int = 1024
    """valid/test sides are truncated to this (targets to max_positions-1); 0 = no
    truncation"""
    limit: int | None = None
    """keep only the first N training pairs, per direction with directions (debugging);
    null = all"""
    shuffle: bool = True
    """shuffle training batches (deterministic per seed and epoch)"""
    num_workers: int = 2
    """DataLoader worker processes"""
    pin_memory: bool | None = None
    """null = pin when CUDA is available"""
    num_proc: int = 1
    """processes tokenising the prepared cache (used for splits of >=1000 pairs per
    process)"""
    seed: int = 0
    """batch order seed and tokenizer sampling seed"""
    pad_to_multiple: int = 1
    """pad batch lengths S, T to a multiple of this (FP8 precision sets 8, the rows te.Linear
    needs)"""
    prepare_data_per_node: bool = True
    """tokenizer + token caches built once per node (false: once per job, cache_dir on a
    filesystem all nodes share)"""
    prepare_timeout: float = 7200.0
    """seconds the other ranks wait for the preparing process before failing"""

    def __post_init__(self) -> None:
        if int(self.pad_to_multiple) < 1:
            raise ConfigError(
                f"data.pad_to_multiple must be >= 1 or null, got {self.pad_to_multiple}"
            )
        for key in ("max_tokens", "eval_max_tokens", "max_positions"):
            if int(getattr(self, key)) < 0:
                raise ConfigError(f"data.{key} must be >= 0 (0 = off), got {getattr(self, key)}")
        check_placement(str(self.tag_placement))
        sampling_weights([1], float(self.sampling_temperature))  # refuses T <= 0 now
        self.extra_test = parse_extra_test(self.extra_test)
        self._fit_filter()

    def _fit_filter(self) -> None:
        """A training pair must fit in a batch and in the model's positions (bos/eos
        included): lower `filter.max_len` to what `max_tokens`/`max_positions` leave."""
        caps = [self.filter.max_len]
        if self.max_positions:
            caps.append(self.max_positions - 1)
        if self.max_tokens:
            caps.append(self.max_tokens - 1)
        if min(caps) < 1:
            raise ConfigError(
                f"data.max_tokens={self.max_tokens} / data.max_positions={self.max_positions} "
                f"leave no room for a single token; raise them"
            )
        if min(caps) < self.filter.max_len:
            log.info("train filter: max_len lowered from %d to %d (max_tokens/max_positions)",
                     self.filter.max_len, min(caps))  # fmt: skip
            self.filter.max_len = min(caps)

    @classmethod
    def from_kwargs(cls, settings: Mapping[str, Any]) -> DataConfig:
        """The settings from `data.*` keys (Hydra's keyword arguments): unknown keys refused
        with a close-match hint, null (or absent) keys keep the default, at every level;
        `tokenizer.seed` null = `seed`.

        Raises:
            ConfigError: an unknown key, or a value the fields refuse.
        """
        values = {k: v for k, v in dict(settings).items() if v is not None}
        tokenizer = values.get("tokenizer")
        if not isinstance(tokenizer, TokenizerConfig):
            tokenizer = {k: v for k, v in (plain(tokenizer) or {}).items() if v is not None}
            tokenizer.setdefault("seed", values.get("seed", cls.seed))
        values.update(
            splits=_nested(SplitNames, values.get("splits"), "data.splits"),
            hub=_nested(HubConfig, values.get("hub"), "data.hub"),
            filter=_nested(FilterConfig, values.get("filter"), "data.filter"),
            tokenizer=_nested(TokenizerConfig, tokenizer, "data.tokenizer"),
        )
        return build(cls, values, "data")

    def batch_budget(self, train: bool) -> tuple[int | None, int | None]:
        """(max_tokens, batch_size) of the train or the valid/test batches (None = no limit)."""
        if train:
            return self.max_tokens or None, self.batch_size
        size = self.eval_batch_size if self.eval_batch_size is not None else self.batch_size
        return self.eval_max_tokens or None, size

    def eval_max_len(self) -> tuple[int | None, int | None]:
        """(source, target) lengths valid/test sides are truncated to (None = no truncation)."""
        lim = self.max_positions or None
        return lim, None if lim is None else lim - 1


def _nested(cls: type, value: Any, where: str) -> Any:
    """A nested settings block (a mapping, an instance of `cls`, or null = every default) as
    a new `cls` (a copy: the DataModule adjusts its filter and tokenizer settings)."""
    if isinstance(value, cls):
        return dataclasses.replace(value)
    # data settings keep "null = the default" at every level (saved run configs spell it so)
    data = {k: v for k, v in (plain(value) or {}).items() if v is not None}
    if cls is HubConfig:
        data["splits"] = _nested(HubSplitNames, data.get("splits"), f"{where}.splits")
    return build(cls, data, where)


def parse_extra_test(value: Any) -> list[str]:
    """`data.extra_test` as a list of split names.

    Raises:
        ConfigError: not a list of non-empty names, or a name given twice.
    """
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(
        isinstance(n, str) and n.strip() for n in names
    ):
        raise ConfigError(
            f"data.extra_test must be a list of split names such as [test_2017_flickr, test_2017_mscoco], "
            f"got {value!r}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"data.extra_test lists a split twice: {list(names)}")
    return [str(n) for n in names]


__all__ = [
    "DataConfig",
    "HubConfig",
    "HubSplitNames",
    "SplitNames",
    "parse_extra_test",
    "resolve_path",
]
