"""benchmarks/server_stop.py runs a real server on the committed fixture export (the ct2 engine):
a large request whose client hangs up is stopped (``/health`` counts it), and the one-line
requests after it are answered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_abandoned_request_is_stopped_and_the_next_answered(tmp_path) -> None:
    src = tmp_path / "src.en"
    src.write_text("\n".join(corpus(seed=2)[0][:50]) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.server_stop", "--model",
         str(REPO / "tests/fixtures/legacy_v0_1/ct2"), "--src", str(src), "--sentences", "20000",
         "--beam", "4", "--hang-up", "0.05", "--plain", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| ct2 |"))
    assert row.split("|")[-2].strip() == "1"  # batches stopped
