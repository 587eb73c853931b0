"""Data: tokenizer (sentencepiece), corpus loading (datasets), bucketing sampler, DataModule.

Names are imported lazily, so `from litmt.data.tokenizer import Tokenizer` (what decoding
needs) does not pay for importing Lightning and `datasets`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Eager: light, and `collate` (the function) must shadow the submodule of the same name.
from litmt.data.collate import TokenizedPairs as TokenizedPairs
from litmt.data.collate import collate as collate

_EXPORTS = {
    "DataConfig": "litmt.data.config",
    "ParallelCorpus": "litmt.data.corpus",
    "TranslationDataModule": "litmt.data.datamodule",
    "ResumableDataLoader": "litmt.data.loader",
    "TokenBudgetBatchSampler": "litmt.data.batch_sampler",
    "Tokenizer": "litmt.data.tokenizer",
    "TokenizerConfig": "litmt.data.tokenizer",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'litmt.data' has no attribute {name!r}")


__all__ = sorted([*_EXPORTS, "TokenizedPairs", "collate"])
