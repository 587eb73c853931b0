"""scripts/gpu_check.sh: its dry run (the GPU code path on the CPU, as CI runs it), the
machine-without-CUDA and machine-without-torch answers, arguments and the data preparation."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from train_utils import REPO, script_env


def run_sh(
    *args: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args], cwd=REPO, env=env or script_env(),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_dry_run_writes_the_whole_table(tmp_path: Path) -> None:
    """The same code path as on the GPU (read the files, tokenise, parity runs, matmul peak,
    throughput, recipe training + beam-5 decoding, the gpu-test step) with a tiny model."""
    out = tmp_path / "out"
    proc = run_sh("--dry-run", "--out", str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "gpu_check_rows.jsonl").read_text().splitlines()]
    by = {(r["check"], r["setting"].split(",")[0]): r for r in rows}
    assert [r["check"] for r in rows] == [
        "environment", *["kernel package"] * 3, "loss parity", "loss parity", "matmul peak",
        "throughput", "flex vs sdpa speed", "recipe BLEU", "FSDP, 1 GPU",
        "FP8 (transformer-engine)", "gpu-marked tests",
    ]  # fmt: skip
    assert by[("loss parity", "sdpa bf16-mixed")]["status"] == "ref"
    assert by[("loss parity", "math bf16-mixed")]["status"] == "ok"  # exact kernels agree
    for pkg in ("flash_attn", "xformers", "transformer_engine"):  # absent here: not a pass
        assert by[("kernel package", pkg)]["status"] in ("not installed", "ok")
    assert "BLEU " in by[("recipe BLEU", "multi30k_cpu model")]["result"]
    assert "MFU " in by[("throughput", "tiny")]["result"]
    gpu_tests = by[("gpu-marked tests", "pytest -m gpu --collect-only")]
    assert gpu_tests["status"] == "ok" and "collected" in gpu_tests["result"]
    assert {r["status"] for r in rows} <= {"ok", "ref", "not installed", "skipped"}
    table = (out / "gpu_check_table.md").read_text()
    assert table.startswith("| check | setting | result | status | peak mem |")
    assert f"{len(rows)} rows, 0 failed" in table
    assert not (out / "gpu_check_current.txt").exists()  # no row left half-measured


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine-without-CUDA path")
def test_without_cuda_the_script_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    proc = run_sh("--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "gpu_check: no CUDA GPU on this machine; nothing to check "
        "(run it where torch.cuda.is_available())"
    ]
    assert not (tmp_path / "out").exists()


def test_a_python3_without_torch_is_an_error_not_a_missing_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**script_env(), "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = run_sh("--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 3
    assert proc.stderr.strip() == (
        "gpu_check: python3 cannot import torch: ModuleNotFoundError: No module named 'torch'"
    )


def test_unknown_argument_is_refused() -> None:
    proc = run_sh("--outdir", "x")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpu_check: unknown argument --outdir (use --out DIR,")


def test_prepare_data_copies_the_multi30k_files(tmp_path: Path) -> None:
    src, dst = tmp_path / "shared", tmp_path / "data"
    src.mkdir()
    names = [f"{s}.{lang}" for s in ("train", "valid", "test2016") for lang in ("en", "de")]
    for name in names:
        (src / name).write_text(f"{name}\n")
    proc = run_sh("--prepare-data", "--from", str(src), "--data", str(dst))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dst.iterdir()) == sorted(names)
    (src / "valid.de").unlink()
    proc = run_sh("--prepare-data", "--from", str(src), "--data", str(tmp_path / "d2"))
    assert proc.returncode == 1
    assert "cannot copy" in proc.stderr and "--from DIR" in proc.stderr
