"""Shared fixtures: tiny model configs and paths to the optional real corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def multi30k_dir() -> Path:
    """The real Multi30k directory (../shared/data/multi30k); skips when absent."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip("real Multi30k data not found at ../shared/data/multi30k")
    return MULTI30K
