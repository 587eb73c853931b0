"""benchmarks/hf_decode.py: the smoke run prints one tokens/s row per engine, and every engine
generates the same number of tokens (the same imported model, beam and limit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

REPO = Path(__file__).resolve().parents[3]


def test_smoke_run_prints_a_tokens_per_second_table():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "benchmarks.hf_decode", "--smoke", "--threads", "1", "--reps", "1"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=300, check=True, cwd=REPO
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| engine | tokens | seconds | tokens/s |"
    engines = [r.split(" | ")[0].strip("| ") for r in rows[1:]]
    assert engines == ["litmt torch", "litmt ct2 (float32)", "transformers generate"]
    tokens = {int(r.split(" | ")[1]) for r in rows[1:]}
    assert len(tokens) == 1 and tokens.pop() > 0
