"""Shared fixtures: tiny model configs and paths to the optional real corpus."""

from __future__ import annotations

import os
import tempfile

# Tests run tiny models, often several processes at once (DDP, subprocess CLIs): one OpenMP
# thread per process avoids oversubscribing the cores (set before torch is imported; it is
# inherited by the scripts the tests start). An explicit OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's on-disk kernel cache is not keyed by ATEN_CPU_CAPABILITY: compiled flex kernels
# cached under `avx2` and reused under `avx512` gave wrong outputs (torch 2.13). One cache per
# capability, so the CI rerun under another capability (.ci/run) compiles its own.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(
        tempfile.gettempdir(),
        f"torchinductor-litmt-{os.environ.get('ATEN_CPU_CAPABILITY', 'native')}",
    ),
)

from pathlib import Path

import pytest
import torch

# The data fixtures (text_corpus, dm_kwargs, make_corpus) of unit/data and integration tests;
# tests/helpers is on pytest's pythonpath (pyproject.toml).
pytest_plugins = ["corpus_fixtures"]

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
