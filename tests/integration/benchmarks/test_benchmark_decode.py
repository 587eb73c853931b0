"""benchmarks/benchmark_decode.py: the smoke run prints one timed row per decode cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_smoke_run_prints_a_markdown_table_of_step_times():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "benchmarks.benchmark_decode", "--smoke", "--threads", "1"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=300, check=True, cwd=REPO
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| decoder self-attention | t = 8 | t = 16 | t = 32 | t = 32 / t = 8 |"
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| sdpa", "| local (window 4)", "| linear"]
    for row in rows[1:]:
        *times, ratio = row.strip("| ").split(" | ")[1:]
        assert len(times) == 3 and all(float(t) > 0 for t in times)
        assert re.fullmatch(r"\d+\.\d\dx", ratio)
