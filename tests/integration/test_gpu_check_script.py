"""scripts/gpu_check.sh without CUDA (one line, exit 0), and its Python part in smoke mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_utils import REPO, script_env


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine-without-CUDA path")
def test_without_cuda_the_script_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path / "out")],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "gpu_check: no CUDA GPU on this machine; nothing to check "
        "(run it where torch.cuda.is_available())"
    ]
    assert not (tmp_path / "out").exists()  # nothing installed, nothing run


def test_unknown_argument_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--outdir", "x"],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpu_check: unknown argument --outdir (use --wheels DIR, --data DIR, --out DIR)"
    )


def test_the_training_checks_run_in_smoke_mode(tmp_path: Path) -> None:
    """The same code paths as on the GPU (tokenise, train each backend, compare with sdpa,
    save, reload and decode, throughput), on the CPU with a toy corpus and a tiny model."""
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--smoke", "--out", str(tmp_path)],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        json.loads(line) for line in (tmp_path / "gpu_check_rows.jsonl").read_text().splitlines()
    ]
    by = {(r["check"], r["setting"].split(",")[0]): r for r in rows}
    assert by[("loss vs sdpa", "sdpa 32-true")]["status"] == "ref"
    math_row = by[("loss vs sdpa", "math 32-true")]
    assert math_row["status"] == "ok", math_row  # exact kernels: the same losses
    decode = by[("decode test2016 (bf16-trained)", "beam 5 on cpu")]
    assert decode["result"].startswith("20 sentences, BLEU ")
    assert all(r["status"] in ("ok", "ref", "skipped") for r in rows), rows
    assert by[("throughput", "base")]["result"].endswith("TFLOP/s")
