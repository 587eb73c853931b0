"""Fixtures of the data tests: tiny corpora written into tmp_path (a plugin of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_corpora import TINY_TOKENIZER, write_text_corpus


@pytest.fixture
def text_corpus(tmp_path: Path) -> Path:
    """A tiny en/de corpus with train/valid/test splits."""
    return write_text_corpus(tmp_path / "corpus")


@pytest.fixture
def dm_kwargs(tmp_path: Path, text_corpus: Path) -> dict:
    """Constructor arguments of a `TranslationDataModule` over `text_corpus`."""
    return {
        "name": "tiny",
        "dir": str(text_corpus),
        "cache_dir": str(tmp_path / "cache"),
        "tokenizer": dict(TINY_TOKENIZER),
        "max_tokens": 200,
        "eval_max_tokens": 200,
        "num_workers": 0,
        "seed": 1,
    }


@pytest.fixture
def make_corpus(tmp_path: Path) -> Callable[..., Path]:
    """Factory: `make_corpus(name, sizes=..., langs=...)` writes another text corpus."""

    def make(name: str, **kwargs: object) -> Path:
        return write_text_corpus(tmp_path / name, **kwargs)  # type: ignore[arg-type]

    return make
