"""The ONNX benchmark scripts run end to end on the tiny model: `checks.onnx_parity` (its
table, its JSON, status 0) and the onnx rows of `benchmarks.benchmark_engines`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus, tiny_checkpoint_path

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("bench")
    en, de = corpus(seed=1)
    (directory / "test.en").write_text("\n".join(en[:20]) + "\n", encoding="utf-8")
    (directory / "test.de").write_text("\n".join(de[:20]) + "\n", encoding="utf-8")
    return tiny_checkpoint_path(tmp_path_factory), directory / "test.en", directory / "test.de"


def _module(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", name, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_onnx_parity_script(files, tmp_path):
    ckpt, src, ref = files
    run = _module(
        "checks.onnx_parity", "--ckpt", str(ckpt), "--src", str(src), "--ref", str(ref),
        "--threads", "1", "--beam", "1", "3", "--exports", str(tmp_path), "--json",
        str(tmp_path / "p.json"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    beams = json.loads((tmp_path / "p.json").read_text())["beams"]
    assert [b["beam"] for b in beams] == [1, 3]
    # float32 graphs of the same model: every difference is a near-tie or a ranking tie
    assert all(
        d["category"] in ("near-tie", "ranking tie") for b in beams for d in b["differences"]
    )
    assert all(b["lines"] == 20 and b["max_score_diff_identical"] < 1e-3 for b in beams)
    assert "| 1 | " in run.stdout and "| 3 | " in run.stdout


def test_engine_speed_onnx_rows(files, tmp_path):
    ckpt, src, ref = files
    run = _module(
        "benchmarks.benchmark_engines", "--smoke", "--ckpt", str(ckpt), "--src", str(src),
        "--ref", str(ref), "--threads", "1", "--exports", str(tmp_path),
        "--engines", "torch", "onnx float32", "onnx int8", "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [(r["engine"], r["beam"]) for r in rows] == [
        (e, b) for e in ("torch", "onnx float32", "onnx int8") for b in (2, 1)
    ]
    torch_bleu = {r["beam"]: r["bleu"] for r in rows if r["engine"] == "torch"}
    for r in rows:
        assert r["sentences_per_s"] > 0
        if r["engine"] == "onnx float32":  # the same search on the same model
            assert r["bleu"] == pytest.approx(torch_bleu[r["beam"]], abs=0.1)
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)
