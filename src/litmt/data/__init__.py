"""Data: tokenizer (sentencepiece), corpus loading (datasets), bucketing sampler, DataModule."""
