"""`PreparedData`: a corpus, its tokenizer and its prepared caches, without Lightning.

`TranslationDataModule` (`litmt.data.datamodule`) is this plus Lightning's hooks. Here: the
settings (`DataConfig`) open the corpora (`litmt.data.corpora.interface.Corpora`: one pair, or
several directions) and the cache layout (`litmt.data.preparation.cache_layout.CacheLayout`); the
tokenizer is trained on a streamed sample of the training split, or reused
(`use_tokenizer`), and cached; each split is tokenised once into memory-mapped token ids
(`litmt.data.preparation.memmap`), which `_pairs` opens as the pairs batches are drawn from (train:
filtered, sampled across directions and, under subword sampling, re-encoded every epoch).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from litmt.data.batching.collate import TokenizedPairs
from litmt.data.config import DataConfig, resolve_path
from litmt.data.corpora.interface import Corpora
from litmt.data.corpora.multi import open_corpora
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.sources import TrainSource, source_tags
from litmt.data.directions import Direction
from litmt.data.preparation.cache_layout import CacheLayout, tokenizer_key
from litmt.data.preparation.encoding import FilterConfig, tokenize_to_cache
from litmt.data.preparation.memmap import TextPairs, is_complete, open_cache, write_text_cache
from litmt.data.preparation.subword_sampling import SampledPairs, check_sampling, describe
from litmt.data.tokenization.cache import cached_tokenizer
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.data.tokenization.training_sample import sample_sentences
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


class PreparedData:
    """The corpora, tokenizer and prepared splits of one `DataConfig`.

    Args:
        config: the settings (copied: the tokenizer's symbols and the filter's max_len are
            adjusted to the corpus and the batch caps).
    """

    def __init__(self, config: DataConfig) -> None:
        cfg = self.config = copy.deepcopy(config)
        root = resolve_path(cfg.cache_dir)
        self.corpora: Corpora = open_corpora(cfg, root / "hf")
        self.src_lang, self.tgt_lang = self.corpora.main.src_lang, self.corpora.main.tgt_lang
        self.layout = CacheLayout(root, cfg.name, self.src_lang, self.tgt_lang)
        # what other modules read (training, finalize, evaluate, fine-tuning, tests)
        self.name, self.seed, self.cache_dir = cfg.name, cfg.seed, root
        self.extra_test: list[str] = cfg.extra_test  # more test splits finalize scores
        self.filter: FilterConfig = cfg.filter  # max_len fitted to the batch/position caps
        self.corpus: ParallelCorpus = self.corpora.main  # the (first) direction's corpus
        self.directions: list[Direction] = self.corpora.directions  # [] for one pair
        self.extra_train: list[TrainSource] = self.corpora.extra
        self.tokenizer_settings = cfg.tokenizer
        symbols = self.tokenizer_settings.user_defined_symbols
        symbols.extend(t for t in self.corpora.tags() if t not in symbols)
        self.given_tokenizer: Tokenizer | None = None  # reused instead of trained (use_tokenizer)
        self.given_tokenizer_origin: str | None = None  # where it comes from (logs)
        if self.tokenizer_settings.model:
            path = resolve_path(self.tokenizer_settings.model)
            self.use_tokenizer(Tokenizer.from_path(path), f"data.tokenizer.model={path}")
        self.tokenizer: Tokenizer | None = None
        self.filter_counts: dict[str, int] | None = None  # train filter counts (prepare/setup)
        self.timings: dict[str, float] = {}  # seconds per stage of the last prepare/setup
        self._text: dict[str, datasets.Dataset] = {}

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
        key = tokenizer_key(self.tokenizer_settings, self.given_tokenizer)
        return self.layout.tokenizer_dir(self.corpora.fingerprint("train"), self.config.limit, key)

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

    def _limit(self, split: str) -> int | None:
        """`data.limit` caps the training split only."""
        return self.config.limit if split == "train" else None

    def _train_tokenizer(self) -> Tokenizer:
        """sentencepiece on a bounded sample of the training split, streamed from disk."""
        s, where = self.tokenizer_settings, self.tokenizer_dir()
        work = where.with_name(f"{where.name}.sample{os.getpid()}")
        try:
            samples = sample_sentences(
                lambda: self.corpora.chunks("train", self._limit("train")), joint=s.joint,
                size=s.input_sentence_size, seed=s.seed, workdir=work,
            )  # fmt: skip
            return Tokenizer.train(samples[0], samples[-1], s, sampled=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # -- token ids and raw text ---------------------------------------------------------
    def _cache_path(self, split: str, tok: Tokenizer) -> Path:
        fp = self.corpora.fingerprint(split)
        return self.layout.token_ids(split, fp, tok, self.config.limit, self.config.filter)

    def _prepared(self, split: str) -> Path:
        """The split's memory-mapped cache, built (streaming) unless already published."""
        tok = self._get_tokenizer()
        path = self._cache_path(split, tok)
        if not is_complete(path):
            train = split == "train"
            counts = tokenize_to_cache(
                self.corpora.chunks(split, self._limit(split)), tok, path,
                num_proc=self.config.num_proc, total=self.corpora.count(split, self._limit(split)),
                filters=self.config.filter if train else None, desc=f"tokenising {split}",
            )  # fmt: skip
            if counts is not None:
                self.filter_counts = counts
        return path

    def _pairs(self, split: str) -> TokenizedPairs:
        """The split's prepared pairs: valid/test truncated to `max_positions`; train
        filtered, sampled across directions and (subword sampling) re-encoded per epoch."""
        a, meta = open_cache(self._prepared(split))
        ids = (a["src.ids"], a["src.off"], a["tgt.ids"], a["tgt.off"], a["index"])
        lens = {"src_lens": a["src.len"], "tgt_lens": a["tgt.len"]}
        if split != "train":
            src_max, tgt_max = self.config.eval_max_len()
            return TokenizedPairs(*ids, max_src_len=src_max, max_tgt_len=tgt_max, **lens)
        self.filter_counts = meta["filter_counts"]
        cfg = self.config
        pairs = self.corpora.resample(
            TokenizedPairs(*ids, **lens), cfg.sampling_temperature, cfg.seed, cfg.limit
        )
        return self._sampled(pairs)

    def _sampled(self, pairs: TokenizedPairs) -> TokenizedPairs:
        """`pairs` re-encoded every epoch under subword sampling, else `pairs` itself."""
        sampling = self.tokenizer_settings.sampling()
        if sampling is None:
            return pairs
        tok = self._get_tokenizer()
        check_sampling(tok, sampling)
        sampled = SampledPairs(
            pairs, self._train_text(), tok, sampling, seed=self.config.seed,
            max_len=self.config.filter.max_len,
        )  # fmt: skip
        ratio = sampled.plan_on_sampled_lengths()
        log.info(
            "%s; sampled items have x%.2f the stored tokens, so batches are planned on the "
            "stored lengths x%.2f to stay within data.max_tokens; %.1f%% of sampled sides "
            "fit no draw and keep their best segmentation", describe(tok, sampling),
            ratio, ratio, 100 * sampled.fallback_rate(),
        )  # fmt: skip
        return sampled

    def _text_cache_path(self) -> Path:
        return self.layout.train_text(self.corpora.fingerprint("train"), self.config.limit)

    def _train_text(self) -> TextPairs:
        """The training split's raw text (subword sampling), written once from the stream
        preparation tokenises (`Corpora.chunks`), so example index i is the same pair in
        both."""
        path = self._text_cache_path()
        if not is_complete(path):
            log.info("subword sampling: writing the train split's raw text to %s", path)
            write_text_cache(self.corpora.chunks("train", self._limit("train")), path)
        return TextPairs(path)

    def _raw(self, split: str) -> datasets.Dataset:
        """The whole split's text in memory: references and sources (valid/test), never
        what training reads."""
        if split not in self._text:
            self._text[split] = self.corpora.load(split, self._limit(split))
        return self._text[split]

    def references(self, split: str) -> list[str]:
        """Raw target sentences of `split` in example-index order (all of them; the training
        split is read whole, so call it only on small corpora)."""
        return [t or "" for t in self._raw(split)["tgt"]]

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of `split`, same order as `references`."""
        return [s or "" for s in self._raw(split)["src"]]

    # -- directions (`data.directions`) ---------------------------------------------------
    def direction_spans(self, split: str) -> list[tuple[str, int, int]] | None:
        """Per direction, (name ``en-de``, first, end) example indices of `split` (valid,
        test), for per-direction scores; None for a one-pair corpus."""
        return self.corpora.direction_spans(split)

    def forced_prefixes(self, split: str, indices: Sequence[int]) -> list[list[int]] | None:
        """Per example index of `split`, the target ids decoding must start with: the
        language token with ``tag_placement=target``, else None (nothing forced)."""
        return self.corpora.forced_prefixes(split, indices, self._get_tokenizer)

    def languages_meta(self) -> dict[str, Any]:
        """What a checkpoint records of its languages beside src_lang/tgt_lang: the
        directions and the tag placement ({} for a one-pair model)."""
        return self.corpora.languages_meta()

    def scored_corpora(self) -> ParallelCorpus | list[ParallelCorpus]:
        """What the end of training scores (`litmt.training.finalize`): the corpus, or one
        corpus per direction of a multilingual model (each scored with its language token)."""
        return self.corpora.scored()


__all__ = ["PreparedData"]
