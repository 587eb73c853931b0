"""Fixtures shared by the server tests: the session's tiny checkpoint and its translator."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoint import tiny_checkpoint_path

from litmt.decoding.translator import Translator


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """The tiny trained checkpoint (built once per session)."""
    return tiny_checkpoint_path(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(ckpt) -> Translator:
    """The torch engine on `ckpt`: what the server's answers are compared with."""
    return Translator.from_checkpoint(ckpt, device="cpu")
