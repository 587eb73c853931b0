"""Shared fixtures: tiny model configs and paths to the optional real corpus."""

from __future__ import annotations

import os

# Tests run tiny models, often several processes at once (DDP, subprocess CLIs): one OpenMP
# thread per process avoids oversubscribing the cores (set before torch is imported; it is
# inherited by the scripts the tests start). An explicit OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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
