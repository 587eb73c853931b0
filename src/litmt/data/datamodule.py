"""`TranslationDataModule`: corpus → sentencepiece → cached token ids → bucketed batches.

`prepare_data` (one process per node) trains or loads the tokenizer and tokenises every
split into the prepared cache; `setup` (every process) memory-maps those caches. Both are
safe to call alone: whatever is missing is built, whatever is cached is reused.

Cache layout under `cache_dir` (default `data/`):
- `tokenizers/{name}-{src}-{tgt}-{settings key}-{corpus hash}/` sentencepiece model(s);
- `cache/{name}-{src}-{tgt}-{split}-{hash}/` memory-mapped token ids of one split
  (`litmt.data.memmap`), keyed by the split's files (path, size, mtime) or hub coordinates,
  the tokenizer bytes, `limit` and (train) the filter settings. Preparation streams the
  corpus in chunks (`litmt.data.streams`); training maps the arrays, so every rank of a node
  shares one copy through the page cache;
- `cache/{name}-{src}-{tgt}-train-text-{hash}/` only with subword sampling
  (`data.tokenizer.sampling_alpha`, `litmt.data.subword_sampling`): the training split's raw
  text, memory-mapped (`litmt.data.memmap.TextPairs`), keyed by the split's files and `limit`;
- `scratch/` the batch sampler's per-epoch arrays of large splits, memory-mapped files that
  each process creates and unlinks at once (`litmt.data.scratch`): never a file left behind.

Batches: see `collate.collate` (keys `src`, `tgt_in`, `tgt_out`, masks, lengths, `index`,
`ntokens` as a python int). Train batches come from `TokenBudgetBatchSampler` (shuffled,
bucketed, deterministic per (seed, epoch), split across DDP ranks, resumable mid-epoch); with
subword sampling their items are encoded again every epoch (`SampledPairs`), on the same plan;
valid/test batches are length-sorted, never filtered, and also split across ranks with
equal batch counts (examples repeat only when a split has fewer examples than ranks, so
gather hypotheses by `index` and drop duplicates).

Under DDP set `trainer.use_distributed_sampler=false`: the sampler reads rank and world
size from `torch.distributed` when the dataloader is created.

`prepare_once` (called by `litmt.cli.train` before the Trainer exists, when launchers such as
torchrun or SLURM have started every rank at once) lets one process per node prepare
(`prepare_data_per_node=true`, Lightning's default) or one per job on a shared filesystem
(`false`), while the others wait for its marker file and then read the caches.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch

from litmt.config import check_keys, plain
from litmt.data.batch_sampler import dist_rank_world
from litmt.data.collate import TokenizedPairs
from litmt.data.corpus import SPLITS, HubSpec, ParallelCorpus, short_hash
from litmt.data.directions import (
    check_placement,
    direction_of,
    lang_tag,
    parse_directions,
    sampling_weights,
)
from litmt.data.loader import ResumableDataLoader, token_budget_loader
from litmt.data.memmap import TextPairs, is_complete, open_cache, write_text_cache
from litmt.data.mixing import MultiCorpus, resample
from litmt.data.prepare_once import is_preparer, prepare_and_publish, wait_for_marker
from litmt.data.preprocess import FilterConfig, tokenize_to_cache
from litmt.data.sources import load_split, parse_train_sources, source_tags, split_fingerprint
from litmt.data.streams import count_pairs, pair_chunks
from litmt.data.subword_sampling import SampledPairs, check_sampling, describe
from litmt.data.tokenizer import Tokenizer, TokenizerConfig
from litmt.data.tokenizer_cache import cached_tokenizer
from litmt.data.tokenizer_sample import sample_sentences
from litmt.errors import ConfigError, DataError
from litmt.runtime.lightning_compat import uses_distributed_sampler

log = logging.getLogger(__name__)

_CACHE_VERSION = 3  # bump when the cache layout changes (3: memory-mapped arrays)


def _resolve_path(path: str | os.PathLike[str]) -> Path:
    """Relative paths are relative to the original working dir (Hydra's, if it runs)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.utils import to_absolute_path

        if HydraConfig.initialized():
            return Path(to_absolute_path(str(path)))
    except ImportError:  # pragma: no cover - hydra is a dependency, but keep data usable alone
        pass
    return Path(path)


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
            f"data.extra_test must be a list of split names such as [test2017, mscoco2017], "
            f"got {value!r}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"data.extra_test lists a split twice: {list(names)}")
    return [str(n) for n in names]


class TranslationDataModule(L.LightningDataModule):
    """Loads a parallel corpus, tokenises it and serves padded batches.

    Args (each one is a key of `conf/data/*.yaml`, where they are documented):
        name: corpus name used in cache keys.
        src_lang, tgt_lang: translation direction.
        dir: local directory (None = the hub); relative to the original working dir.
        format: local format: text | tsv | jsonl | parquet.
        splits: split → local file stem, e.g. {train: train, valid: valid, test: test2016}.
        hub: {path, name, revision, splits} of the hub copy.
        layout, columns, translation_column: how tables (hub, tsv/jsonl/parquet) hold text.
        extra_train: more training sources appended to the train split, each a dict
            (`litmt.data.sources.parse_train_sources`), optionally tagged (e.g. `<BT>`).
        directions: several directions in one model, e.g. ["en-de", "en-fr"]
            (`litmt.data.mixing`); None/[] = the one pair `src_lang`→`tgt_lang`. The first
            direction becomes `src_lang`/`tgt_lang`.
        tag_placement: where the target-language token `<2xx>` goes: "source" or "target"
            (`litmt.data.directions`).
        sampling_temperature: T of the sampling across directions (1 = proportional,
            inf = uniform).
        extra_test: more test sets scored at the end of training (`finalize`), each a split
            name (local file stem or hub split), e.g. ["test2017", "mscoco2017"]; a set absent
            from the data is skipped with a warning. Never used to choose anything.
        tokenizer: `TokenizerConfig` fields.
        cache_dir: root of the tokenizer and token-id caches.
        max_tokens: train token budget per batch, padding included (None = by sentences).
        batch_size: sentences per train batch when `max_tokens` is None (else a cap).
        eval_max_tokens, eval_batch_size: the same for valid/test (None = train values).
        filter: `FilterConfig` fields for the train split.
        bucket_pool: sort within pools of this many batches' worth (None = whole split).
        max_positions: valid/test sources and targets are truncated to this many tokens
            (targets to max_positions - 1, leaving room for bos/eos).
        limit: keep only the first N training examples (debugging).
        num_workers, pin_memory (None = on when CUDA is available), num_proc, seed.
        pad_to_multiple: pad every batch's S and T to a multiple of this (None = 1, or 8 set
            by `litmt.cli.train` under FP8 precision); token budgets count the padded lengths.
        prepare_data_per_node: `prepare_once` prepares on local rank 0 of every node (true)
            or only on global rank 0 (false: the cache is on a filesystem every node shares).
        prepare_timeout: seconds a waiting rank waits for the preparing one.
    """

    def __init__(
        self,
        name: str = "corpus",
        src_lang: str = "en",
        tgt_lang: str = "de",
        dir: str | None = None,
        format: str = "text",
        splits: Mapping[str, str] | None = None,
        hub: Mapping[str, Any] | None = None,
        layout: str = "columns",
        columns: Mapping[str, str] | None = None,
        translation_column: str = "translation",
        extra_train: Any = None,
        directions: Any = None,
        tag_placement: str = "source",
        sampling_temperature: float = 1.0,
        extra_test: Any = None,
        tokenizer: Mapping[str, Any] | None = None,
        cache_dir: str = "data",
        max_tokens: int | None = 4096,
        batch_size: int | None = None,
        eval_max_tokens: int | None = None,
        eval_batch_size: int | None = None,
        filter: Mapping[str, Any] | None = None,
        bucket_pool: int | None = None,
        max_positions: int | None = 1024,
        limit: int | None = None,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        num_proc: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        pad_to_multiple: int | None = None,
        prepare_data_per_node: bool = True,
        prepare_timeout: float = 7200.0,
    ) -> None:
        super().__init__()
        if pad_to_multiple is not None and int(pad_to_multiple) < 1:
            raise ConfigError(f"data.pad_to_multiple must be >= 1 or null, got {pad_to_multiple}")
        self.pad_to_multiple = int(pad_to_multiple or 1)
        self.prepare_data_per_node = bool(prepare_data_per_node)  # Lightning's DataHooks flag
        self.prepare_timeout = float(prepare_timeout)
        self.name, self.src_lang, self.tgt_lang = str(name), str(src_lang), str(tgt_lang)
        tok = plain(tokenizer) or {}
        check_keys(tok, (f.name for f in fields(TokenizerConfig)), "data.tokenizer")
        tok.setdefault("seed", seed)
        self.tokenizer_settings = TokenizerConfig(**tok)
        flt = plain(filter) or {}
        check_keys(flt, (f.name for f in fields(FilterConfig)), "data.filter")
        self.filter = FilterConfig(**flt)
        self.cache_dir = _resolve_path(cache_dir)
        local_dir = _resolve_path(dir) if dir is not None else None
        split_map = {"train": "train", "valid": "valid", "test": "test"}
        split_map.update(plain(splits) or {})
        hub_spec = HubSpec(**(plain(hub) or {}))
        self.corpus = ParallelCorpus(
            src_lang=self.src_lang,
            tgt_lang=self.tgt_lang,
            dir=local_dir,
            format=format,
            splits=split_map,
            hub=hub_spec,
            layout=layout,
            columns=plain(columns),
            translation_column=translation_column,
            hf_cache_dir=str(self.cache_dir / "hf"),
        )
        self.directions = parse_directions(plain(directions))
        self.extra_train = parse_train_sources(
            plain(extra_train),
            src_lang=self.src_lang,
            tgt_lang=self.tgt_lang,
            resolve=_resolve_path,
            hf_cache_dir=str(self.cache_dir / "hf"),
            directions=[d.name for d in self.directions] or None,
        )
        self.tag_placement = check_placement(str(tag_placement))
        self.sampling_temperature = float(sampling_temperature)
        sampling_weights([1], self.sampling_temperature)  # refuses T <= 0 now
        self.extra_test = parse_extra_test(plain(extra_test))
        self.multi: MultiCorpus | None = None
        self._offsets: dict[str, list[int]] = {}  # split -> direction start offsets
        if self.directions:
            first = self.directions[0]
            self.src_lang, self.tgt_lang = first.src, first.tgt
            corpora = [
                dataclasses.replace(
                    self.corpus, src_lang=d.src, tgt_lang=d.tgt,
                    dir=_resolve_path(d.dir) if d.dir is not None else self.corpus.dir,
                    splits={**self.corpus.splits, **dict(d.splits)},
                )
                for d in self.directions
            ]  # fmt: skip
            self.corpus = corpora[0]
            self.multi = MultiCorpus(
                self.directions, corpora, self.tag_placement, extra=self.extra_train
            )
        symbols = self.tokenizer_settings.user_defined_symbols
        symbols.extend(t for t in source_tags(self.extra_train) if t not in symbols)
        symbols.extend(
            t for t in dict.fromkeys(lang_tag(d.tgt) for d in self.directions) if t not in symbols
        )
        self.given_tokenizer: Tokenizer | None = None  # reused instead of trained (use_tokenizer)
        self.given_tokenizer_origin: str | None = None  # where it comes from (logs)
        if self.tokenizer_settings.model:
            path = _resolve_path(self.tokenizer_settings.model)
            self.use_tokenizer(Tokenizer.from_path(path), f"data.tokenizer.model={path}")
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.eval_max_tokens = eval_max_tokens if eval_max_tokens is not None else max_tokens
        self.eval_batch_size = eval_batch_size if eval_batch_size is not None else batch_size
        self.bucket_pool, self.max_positions, self.limit = bucket_pool, max_positions, limit
        self.num_workers, self.pin_memory, self.seed = num_workers, pin_memory, seed
        self.num_proc, self.shuffle = num_proc, shuffle
        # a training pair must fit in a batch and in the model's positions (bos/eos included)
        caps = [self.filter.max_len]
        if max_positions is not None:
            caps.append(max_positions - 1)
        if max_tokens is not None:
            caps.append(max_tokens - 1)
        if min(caps) < 1:
            raise ConfigError(
                f"data.max_tokens={max_tokens} / data.max_positions={max_positions} leave no room "
                f"for a single token; raise them"
            )
        if min(caps) < self.filter.max_len:
            log.info("train filter: max_len lowered from %d to %d (max_tokens/max_positions)",
                     self.filter.max_len, min(caps))  # fmt: skip
            self.filter.max_len = min(caps)
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict[str, TokenizedPairs] = {}
        self._text: dict[str, datasets.Dataset] = {}
        self.timings: dict[str, float] = {}  # seconds per stage of the last prepare/setup
        self._prepared_paths: list[str] = []  # what the last prepare_data published

    # -- tokenizer ----------------------------------------------------------------------
    def use_tokenizer(self, tokenizer: Tokenizer, origin: str) -> None:
        """Use an existing tokenizer (byte-identical) instead of training one.

        Args:
            tokenizer: e.g. the tokenizer of the checkpoint fine-tuning starts from.
            origin: where it comes from, for logs and errors.

        Raises:
            ConfigError: a tag of `extra_train` is not one of its user-defined symbols.
        """
        for tag in source_tags(self.extra_train):
            if tag not in tokenizer.src_tags:
                raise ConfigError(
                    f"the tag {tag} of data.extra_train is not a user-defined symbol of the "
                    f"tokenizer from {origin}; train that tokenizer with "
                    f"data.tokenizer.user_defined_symbols=[{tag}], or drop the tag"
                )
        self.given_tokenizer, self.given_tokenizer_origin = tokenizer, origin
        self.tokenizer = None

    def tokenizer_dir(self) -> Path:
        """Where this corpus/direction/settings' sentencepiece models are cached."""
        fp = self._fingerprint("train")
        if self.limit is not None:
            fp = short_hash(fp, self.limit)
        key = self.tokenizer_settings.key()
        if self.given_tokenizer is not None:  # reused, not trained: keyed by its bytes
            given = self.given_tokenizer
            key = "given-" + short_hash(*given.identity(), n=12)
        return (
            self.cache_dir
            / "tokenizers"
            / f"{self.name}-{self.src_lang}-{self.tgt_lang}-{key}-{fp[:8]}"
        )

    def _get_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            self.tokenizer = cached_tokenizer(
                self.tokenizer_dir(),
                train=self._train_tokenizer,
                given=self.given_tokenizer,
                given_origin=self.given_tokenizer_origin,
                timings=self.timings,
            )
        return self.tokenizer

    def _chunks(self, split: str) -> Any:
        """The pairs of `split` as a stream of chunks (`litmt.data.streams.pair_chunks`)."""
        limit = self.limit if split == "train" else None
        if self.multi is not None:
            return self.multi.chunks(split, limit=limit)
        return pair_chunks(self.corpus, self.extra_train, split, limit=limit)

    def _fingerprint(self, split: str) -> str:
        if self.multi is not None:
            return self.multi.fingerprint(split)
        return split_fingerprint(self.corpus, self.extra_train, split)

    def _count(self, split: str) -> int | None:
        if self.multi is not None:
            return sum(self.multi.sizes(split, self.limit if split == "train" else None))
        return count_pairs(self.corpus, self.extra_train, split)

    def _train_tokenizer(self) -> Tokenizer:
        """sentencepiece on a bounded sample of the training split, streamed from disk."""
        s = self.tokenizer_settings
        work = self.tokenizer_dir().with_name(self.tokenizer_dir().name + f".sample{os.getpid()}")
        try:
            samples = sample_sentences(
                lambda: self._chunks("train"), joint=s.joint, size=s.input_sentence_size,
                seed=s.seed, workdir=work,
            )  # fmt: skip
            return Tokenizer.train(samples[0], samples[-1], s, sampled=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # -- raw text and token ids -----------------------------------------------------------
    def _raw(self, split: str) -> datasets.Dataset:
        """The whole split's text in memory: references and sources (valid/test), never
        what training reads."""
        if split not in self._text and self.multi is not None:
            self._text[split] = self.multi.load(split, self.limit if split == "train" else None)
        if split not in self._text:
            ds = load_split(self.corpus, self.extra_train, split)
            if split == "train" and self.limit is not None:
                ds = ds.select(range(min(self.limit, len(ds))))
            self._text[split] = ds
        return self._text[split]

    def _cache_path(self, split: str, tok: Tokenizer) -> Path:
        fp = self._fingerprint(split)
        train = split == "train"
        key = short_hash(
            _CACHE_VERSION, fp, short_hash(*tok.identity()),
            self.limit if train else None, repr(self.filter) if train else None,
        )  # fmt: skip
        return (
            self.cache_dir / "cache" / f"{self.name}-{self.src_lang}-{self.tgt_lang}-{split}-{key}"
        )

    def _prepared(self, split: str) -> Path:
        """The split's memory-mapped cache, built (streaming) unless already published."""
        tok = self._get_tokenizer()
        path = self._cache_path(split, tok)
        if not is_complete(path):
            train = split == "train"
            total = self._count(split)
            if train and total is not None and self.limit is not None:
                total = min(total, self.limit)
            counts = tokenize_to_cache(
                self._chunks(split), tok, path, num_proc=self.num_proc, total=total,
                filters=self.filter if train else None, desc=f"tokenising {split}",
            )  # fmt: skip
            if counts is not None:
                self.filter_counts = counts
        return path

    def _pairs(self, split: str) -> TokenizedPairs:
        arrays, meta = open_cache(self._prepared(split))
        a = arrays
        if split != "train":
            lim = self.max_positions
            return TokenizedPairs(
                a["src.ids"], a["src.off"], a["tgt.ids"], a["tgt.off"], a["index"],
                max_src_len=lim, max_tgt_len=None if lim is None else lim - 1,
                src_lens=a["src.len"], tgt_lens=a["tgt.len"],
            )  # fmt: skip
        self.filter_counts = meta["filter_counts"]
        pairs = TokenizedPairs(
            a["src.ids"], a["src.off"], a["tgt.ids"], a["tgt.off"], a["index"],
            src_lens=a["src.len"], tgt_lens=a["tgt.len"],
        )  # fmt: skip
        if self.multi is not None:
            offsets = self.multi.offsets("train", self.limit)
            pairs = resample(pairs, offsets, self.directions, self.sampling_temperature, self.seed)
        sampling = self.tokenizer_settings.sampling()
        if sampling is None:
            return pairs
        tok = self._get_tokenizer()
        check_sampling(tok, sampling)
        sampled = SampledPairs(
            pairs, self._train_text(), tok, sampling, seed=self.seed, max_len=self.filter.max_len
        )
        ratio = sampled.plan_on_sampled_lengths()
        log.info(
            "%s; sampled items have x%.2f the stored tokens, so batches are planned on the "
            "stored lengths x%.2f to stay within data.max_tokens; %.1f%% of sampled sides "
            "fit no draw and keep their best segmentation", describe(tok, sampling),
            ratio, ratio, 100 * sampled.fallback_rate(),
        )  # fmt: skip
        return sampled

    def _text_cache_path(self) -> Path:
        key = short_hash(_CACHE_VERSION, "text", self._fingerprint("train"), self.limit)
        name = f"{self.name}-{self.src_lang}-{self.tgt_lang}-train-text-{key}"
        return self.cache_dir / "cache" / name

    def _train_text(self) -> TextPairs:
        """The training split's raw text (subword sampling), written once from the stream
        preparation tokenises (`_chunks`), so example index i is the same pair in both."""
        path = self._text_cache_path()
        if not is_complete(path):
            log.info("subword sampling: writing the train split's raw text to %s", path)
            write_text_cache(self._chunks("train"), path)
        return TextPairs(path)

    # -- directions (`data.directions`) ----------------------------------------------------
    def direction_spans(self, split: str) -> list[tuple[str, int, int]] | None:
        """Per direction, (name ``en-de``, first, end) example indices of `split` (valid,
        test), for per-direction scores; None for a one-pair corpus."""
        if self.multi is None:
            return None
        if split not in self._offsets:  # counted once (valid is decoded every epoch)
            self._offsets[split] = self.multi.offsets(split)
        offsets = self._offsets[split]
        return [(d.name, offsets[k], offsets[k + 1]) for k, d in enumerate(self.directions)]

    def forced_prefixes(self, split: str, indices: Any) -> list[list[int]] | None:
        """Per example index of `split`, the target ids decoding must start with: the
        language token with ``tag_placement=target``, else None (nothing forced)."""
        if self.multi is None or self.tag_placement != "target":
            return None
        tok = self._get_tokenizer()
        spans = self.direction_spans(split) or []
        which = direction_of([0, *(end for _, _, end in spans)], np.asarray(indices))
        return [[tok.tgt_tags[self.directions[int(k)].tag]] for k in which]

    def languages_meta(self) -> dict[str, Any]:
        """What a checkpoint records of its languages beside src_lang/tgt_lang: the
        directions and the tag placement ({} for a one-pair model)."""
        if self.multi is None:
            return {}
        return {
            "directions": [d.name for d in self.directions],
            "tag_placement": self.tag_placement,
        }

    def scored_corpora(self) -> ParallelCorpus | list[ParallelCorpus]:
        """What the end of training scores (`litmt.training.finalize`): the corpus, or one
        corpus per direction of a multilingual model (each scored with its language token)."""
        return list(self.multi.corpora) if self.multi is not None else self.corpus

    # -- LightningDataModule ------------------------------------------------------------
    def prepare_data(self) -> None:
        """Train/load the tokenizer and tokenise every split into the cache (one process)."""
        t0 = time.perf_counter()
        tok = self._get_tokenizer()
        self._prepared_paths = [str(self.tokenizer_dir())]
        for split in SPLITS:
            try:
                self._prepared(split)
            except DataError as exc:
                if split != "test":
                    raise
                # training does not need a test split; `setup("test")` raises this again
                log.warning("test split unavailable (%s)", exc)
                continue
            self._prepared_paths.append(str(self._cache_path(split, tok)))
        if self.tokenizer_settings.sampling() is not None:  # what the train split re-encodes
            self._prepared_paths.append(str(self._train_text().path))
        self.timings["prepare_s"] = time.perf_counter() - t0
        del tok

    # -- prepare once per node (or per job), the other ranks wait (`litmt.data.prepare_once`) --
    def prepared_marker(self) -> Path:
        """The file the preparing process writes when the caches are complete (or it failed)."""
        return self.cache_dir / "prepared" / f"{self.tokenizer_dir().name}.json"

    def is_preparer(self) -> bool:
        """Whether this process prepares the data (`litmt.data.prepare_once.is_preparer`)."""
        return is_preparer(self.prepare_data_per_node)

    def prepare_once(self, poll_s: float = 0.5) -> None:
        """Prepare the data in one process per node (or per job); other processes wait.

        Works before any process group exists: the preparer writes a JSON marker under
        `cache_dir/prepared/` once every cache is published (or, on failure, a failed
        marker), and the others poll it (`litmt.data.prepare_once`).

        Raises:
            DataError: the preparing process failed, or did not finish in `prepare_timeout`.
        """
        marker = self.prepared_marker()
        if self.is_preparer():

            def prepare() -> list[str]:
                self.prepare_data()
                return self._prepared_paths  # what the waiting ranks check

            prepare_and_publish(prepare, marker)
            return
        wait_for_marker(
            marker,
            per_node=self.prepare_data_per_node,
            timeout=self.prepare_timeout,
            poll_s=poll_s,
        )

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the splits `stage` needs (fit: train+valid)."""
        t0 = time.perf_counter()
        self._get_tokenizer()
        need = {
            "fit": ("train", "valid"),
            "validate": ("valid",),
            "test": ("test",),
            "predict": ("test",),
        }.get(stage or "", SPLITS)
        for split in need:
            if split not in self.datasets:
                self.datasets[split] = self._pairs(split)
        self.timings["setup_s"] = time.perf_counter() - t0

    def _dataset(self, split: str) -> TokenizedPairs:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; use one of {SPLITS}")
        if split not in self.datasets:
            self.setup({"train": "fit", "valid": "validate", "test": "test"}[split])
        return self.datasets[split]

    def references(self, split: str) -> list[str]:
        """Raw target sentences of `split` in example-index order (all of them; the training
        split is read whole, so call it only on small corpora)."""
        return [t or "" for t in self._raw(split)["tgt"]]

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of `split`, same order as `references`."""
        return [s or "" for s in self._raw(split)["src"]]

    def _pin(self) -> bool:
        return torch.cuda.is_available() if self.pin_memory is None else bool(self.pin_memory)

    def _loader(self, split: str, train: bool) -> ResumableDataLoader:
        ds = self._dataset(split)
        self._check_distributed()
        loader = token_budget_loader(
            ds,
            max_tokens=self.max_tokens if train else self.eval_max_tokens,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train and self.shuffle,
            bucket_pool=self.bucket_pool if train else None,
            seed=self.seed,
            pad_to_multiple=self.pad_to_multiple,
            num_workers=self.num_workers,
            pin_memory=self._pin(),
            scratch_dir=self.cache_dir / "scratch",
        )
        if train and self.trainer is not None:
            loader.set_epoch(self.trainer.current_epoch)
        return loader

    def _check_distributed(self) -> None:
        trainer = self.trainer
        if trainer is None or dist_rank_world()[1] == 1:
            return
        if uses_distributed_sampler(trainer):
            raise ConfigError(
                "TranslationDataModule splits batches across ranks itself; set "
                "trainer.use_distributed_sampler=false"
            )

    def train_dataloader(self) -> ResumableDataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> ResumableDataLoader:
        return self._loader("valid", train=False)

    def test_dataloader(self) -> ResumableDataLoader:
        return self._loader("test", train=False)
