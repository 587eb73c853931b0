"""Data: tokenizer (sentencepiece), corpus loading (datasets), bucketing sampler, DataModule."""

from litmt.data.collate import TokenizedPairs, collate
from litmt.data.corpus import ParallelCorpus
from litmt.data.datamodule import TranslationDataModule
from litmt.data.loader import ResumableDataLoader
from litmt.data.sampler import TokenBudgetBatchSampler
from litmt.data.tokenizer import Tokenizer, TokenizerSettings

__all__ = [
    "ParallelCorpus",
    "ResumableDataLoader",
    "TokenBudgetBatchSampler",
    "TokenizedPairs",
    "Tokenizer",
    "TokenizerSettings",
    "TranslationDataModule",
    "collate",
]
