"""benchmarks/hf_decode.py: the smoke run prints one tokens/s row per model, engine and search
(the tiny Marian of OPUS-MT's shape, and a trained tiny checkpoint exported for transformers),
the float32 engines generate the same number of tokens (the same model, search and limit), and
the goal lines name every search."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import tiny_checkpoint_path

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[3]
ENGINES = ["litmt torch", "transformers generate", "ct2 float32", "ct2 int8", "onnx float32",
           "onnx int8"]  # fmt: skip


@pytest.mark.slow
def test_smoke_run_prints_every_engine_and_search(tmp_path_factory):
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "benchmarks.hf_decode", "--smoke", "--threads", "1", "--reps",
           "1", "--beam", "1", "3", "--ckpt", str(ckpt)]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=600, check=True, cwd=REPO
    )
    rows = [line.strip("| ").split(" | ") for line in out.stdout.splitlines() if line[:2] == "| "]
    assert rows[0] == ["model", "engine", "search", "tokens", "seconds", "tokens/s", "sentences/s"]
    table = rows[1:]  # the separator row does not start with "| "
    models = list(dict.fromkeys(r[0] for r in table))
    assert models == ["OPUS-MT size", ckpt.name]
    for model in models:
        for search in ("greedy", "beam 3"):
            cells = {r[1]: int(r[3]) for r in table if r[0] == model and r[2] == search}
            assert list(cells) == ENGINES
            float32 = {cells[e] for e in ENGINES if "int8" not in e}
            assert len(float32) == 1 and float32.pop() > 0, (model, search, cells)
    goals = [line for line in out.stdout.splitlines() if "(goal >= 1)" in line]
    assert len(goals) == 2 * 2 * 3  # models x searches x (onnx float32, onnx int8, torch)
