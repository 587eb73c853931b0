"""Where the DataModule's caches live under `data.cache_dir`, and what keys them.

- ``tokenizers/{name}-{src}-{tgt}-{settings key}-{corpus hash}/``: the sentencepiece
  model(s) (`litmt.data.tokenization.cache`), keyed by the tokenizer settings (or, for a given
  tokenizer, its bytes), the training split's fingerprint and `limit`;
- ``cache/{name}-{src}-{tgt}-{split}-{hash}/``: the memory-mapped token ids of one split
  (`litmt.data.preparation.memmap`), keyed by the split's files (path, size, mtime) or hub coordinates,
  the tokenizer bytes, `limit` and (train) the filter settings. Preparation streams the
  corpus in chunks (`litmt.data.corpora.streams`); training maps the arrays, so every rank of a node
  shares one copy through the page cache;
- ``cache/{name}-{src}-{tgt}-train-text-{hash}/``: only with subword sampling
  (`data.tokenizer.sampling_alpha`, `litmt.data.preparation.subword_sampling`): the training split's raw
  text, memory-mapped (`litmt.data.preparation.memmap.TextPairs`), keyed by its files and `limit`;
- ``prepared/{tokenizer folder}.json``: the marker the preparing process writes when every
  cache is complete (`litmt.data.preparation.once`);
- ``scratch/``: the batch sampler's per-epoch arrays of large splits, memory-mapped files
  each process creates and unlinks at once (`litmt.data.batching.scratch`): never a file left behind;
- ``hf/``: the `datasets` library's own caches (hub downloads, JSONL/parquet tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litmt.data.corpora.parallel import short_hash
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig

CACHE_VERSION = 3  # bump when the cache layout changes (3: memory-mapped arrays)


def tokenizer_key(settings: TokenizerConfig, given: Tokenizer | None) -> str:
    """The tokenizer part of a tokenizer folder's name: the training settings, or the bytes
    of a tokenizer reused instead of trained (`TranslationDataModule.use_tokenizer`)."""
    if given is None:
        return settings.key()
    return "given-" + short_hash(*given.identity(), n=12)


@dataclass(frozen=True)
class CacheLayout:
    """The cache paths of one corpus and direction (`name`, `src_lang`, `tgt_lang`).

    Fingerprints are the corpus's (`litmt.data.corpora.interface.Corpora.fingerprint`); `limit` is
    `data.limit`.
    """

    root: Path  # data.cache_dir, resolved
    name: str
    src_lang: str
    tgt_lang: str

    @property
    def _stem(self) -> str:
        return f"{self.name}-{self.src_lang}-{self.tgt_lang}"

    @property
    def hf(self) -> Path:
        """Where `datasets` keeps its caches."""
        return self.root / "hf"

    @property
    def scratch(self) -> Path:
        """The batch sampler's scratch arrays (`litmt.data.batching.scratch`)."""
        return self.root / "scratch"

    def tokenizer_dir(self, train_fingerprint: str, limit: int | None, key: str) -> Path:
        """The sentencepiece model folder (`key`: `tokenizer_key`)."""
        fp = train_fingerprint if limit is None else short_hash(train_fingerprint, limit)
        return self.root / "tokenizers" / f"{self._stem}-{key}-{fp[:8]}"

    def token_ids(
        self,
        split: str,
        fingerprint: str,
        tokenizer: Tokenizer,
        limit: int | None,
        filters: Any,
    ) -> Path:
        """The memory-mapped token ids of `split` (`limit` and `filters` key train only)."""
        train = split == "train"
        key = short_hash(
            CACHE_VERSION, fingerprint, short_hash(*tokenizer.identity()),
            limit if train else None, repr(filters) if train else None,
        )  # fmt: skip
        return self.root / "cache" / f"{self._stem}-{split}-{key}"

    def train_text(self, train_fingerprint: str, limit: int | None) -> Path:
        """The training split's raw text (subword sampling only)."""
        key = short_hash(CACHE_VERSION, "text", train_fingerprint, limit)
        return self.root / "cache" / f"{self._stem}-train-text-{key}"

    def prepared_marker(self, tokenizer_dir: Path) -> Path:
        """The file the preparing process writes when the caches are complete (or failed)."""
        return self.root / "prepared" / f"{tokenizer_dir.name}.json"


__all__ = ["CACHE_VERSION", "CacheLayout", "tokenizer_key"]
