"""Data: tokenizer (sentencepiece), corpus loading (datasets), bucketing sampler, DataModule.

Names are imported lazily, so `from litmt.data.tokenization.tokenizer import Tokenizer` (what decoding
needs) does not pay for importing Lightning and `datasets`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Eager: light, and `collate` (the function) must shadow the submodule of the same name.
from litmt.data.batching.collate import TokenizedPairs as TokenizedPairs
from litmt.data.batching.collate import collate as collate

_EXPORTS = {
    "DataConfig": "litmt.data.config",
    "ParallelCorpus": "litmt.data.corpora.parallel",
    "TranslationDataModule": "litmt.data.datamodule",
    "ResumableDataLoader": "litmt.data.batching.loader",
    "TokenBudgetBatchSampler": "litmt.data.batching.sampler",
    "Tokenizer": "litmt.data.tokenization.tokenizer",
    "TokenizerConfig": "litmt.data.tokenization.tokenizer",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'litmt.data' has no attribute {name!r}")


__all__ = sorted([*_EXPORTS, "TokenizedPairs", "collate"])
