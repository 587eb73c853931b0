"""scripts/gpu_check.sh: its dry run (the GPU code path on the CPU, as CI runs it), the
machine-without-CUDA and machine-without-torch answers, arguments and the data preparation."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

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


# The rows of the dry run, in order (the last one is gpu_check.sh's own).
CHECKS = [
    "environment", *["kernel package"] * 3, "corpus", "loss parity", "loss parity",
    "matmul peak", "throughput", "flex vs sdpa speed", "recipe BLEU", "FSDP, 1 GPU",
    "FP8 (transformer-engine)", "gpu-marked tests",
]  # fmt: skip


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "gpu_check_rows.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_dry_run_writes_the_whole_table(tmp_path: Path) -> None:
    """The same code path as on the GPU (read the files, tokenise, parity runs, matmul peak,
    throughput, recipe training + beam-5 decoding, the gpu-test step) with a tiny model."""
    out = tmp_path / "out"
    proc = run_sh("--dry-run", "--out", str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_rows(out)
    by = {(r["check"], r["setting"].split(",")[0]): r for r in rows}
    assert [r["check"] for r in rows] == CHECKS
    plan = [json.loads(line) for line in (out / "gpu_check_plan.jsonl").read_text().splitlines()]
    assert plan == [{"check": r["check"], "setting": r["setting"]} for r in rows[:-1]]
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


def fake_flash_attn(root: Path) -> Path:
    """A namespace-style `flash_attn` (pkgutil.extend_path) without FlashAttention-2: found by
    importlib.util.find_spec, imports, and has no `flash_attn_func`."""
    pkg = root / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"
    )
    return root


@pytest.mark.slow
def test_an_exception_in_one_row_is_its_fail_and_every_other_row_is_still_written(
    tmp_path: Path,
) -> None:
    """--inject-failure makes the throughput row raise inside its guard; with an unusable
    flash_attn on the path, its package row says why instead of crashing the script."""
    out = tmp_path / "out"
    env = script_env()
    env["PYTHONPATH"] = f"{fake_flash_attn(tmp_path / 'site')}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_sh("--dry-run", "--out", str(out), "--inject-failure", "throughput", env=env,
                  timeout=240)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_rows(out)
    assert [r["check"] for r in rows] == CHECKS
    failed = [r for r in rows if r["status"] == "FAIL"]
    assert [r["check"] for r in failed] == ["throughput"]
    assert failed[0]["result"] == (
        "error: InjectedFailure: injected by --inject-failure 'throughput'"
    )
    flash = next(r for r in rows if r["setting"] == "flash_attn")
    assert flash["status"] == "not usable"
    assert flash["result"] == (
        "not usable: flash_attn.flash_attn_func: AttributeError: module 'flash_attn' has no "
        "attribute 'flash_attn_func'; its rows are not run"
    )
    by = {r["check"]: r for r in rows}
    assert by["recipe BLEU"]["status"] == "ok"  # the rows after the failure still ran
    assert by["gpu-marked tests"]["status"] == "ok"
    table = (out / "gpu_check_table.md").read_text()
    assert f"{len(CHECKS)} rows, 1 failed" in table
    assert table.rstrip().endswith("failed: throughput | tiny, bf16, sdpa, max_tokens 256, 2 steps")
    assert "InjectedFailure" in (out / "gpu_check_runs.log").read_text()  # the traceback


@pytest.mark.slow
def test_rows_a_crash_leaves_unwritten_are_fail_rows_in_the_table(tmp_path: Path) -> None:
    """--inject-crash ends gpu_check.py at the matmul row (as a segfault would, without a
    row): gpu_check.sh compares its plan with the rows and adds every missing one as FAIL."""
    out = tmp_path / "out"
    proc = run_sh("--dry-run", "--out", str(out), "--inject-crash", "matmul peak", timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_rows(out)
    assert [r["check"] for r in rows] == CHECKS
    failed = [r["check"] for r in rows if r["status"] == "FAIL"]
    assert failed == CHECKS[CHECKS.index("matmul peak") : -1]
    matmul = next(r for r in rows if r["check"] == "matmul peak")
    assert matmul["result"].startswith(
        "not written: gpu_check.py stopped (exit 70) during: matmul peak | float32 128x128x128"
    )
    assert f"{len(CHECKS)} rows, {len(failed)} failed" in (out / "gpu_check_table.md").read_text()


def test_injections_are_refused_outside_the_dry_run() -> None:
    proc = run_sh("--inject-failure", "throughput")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpu_check: --inject-failure is for the dry run only (add --dry-run)"
    )


@pytest.fixture
def check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """scripts/gpu_check_{common,kernels,rows}.py imported in this process, and a `State` for
    bf16 parity rows of sdpa and flex whose training runs are faked by `fake_runs`."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import gpu_check_common as common
    import gpu_check_kernels as kernels
    import gpu_check_rows

    from litmt.attention.backends import flex_compile

    monkeypatch.setitem(flex_compile.STATE, "why", None)
    args = argparse.Namespace(steps=4, run_cap_s=60.0, flex_compile_s=90.0, margin_s=2.0,
                              size={}, backends=("sdpa", "flex"), speed_skip=0)  # fmt: skip
    st = common.State(args, gpu_check_rows.Rows(tmp_path), common.Deadline(600.0))
    st.corpus, st.flex_compile_left = object(), args.flex_compile_s  # the fake runs read neither
    st.ref["bf16-mixed"] = 2.0
    return argparse.Namespace(common=common, kernels=kernels, state=st, STATE=flex_compile.STATE)


def fake_runs(check: Any, monkeypatch: pytest.MonkeyPatch, first_step_s: float, why=None) -> list:
    """Replace train_run: 4 steps of loss 2.0, the first taking `first_step_s` (compiling), the
    others 1 s; `why` set as the compile fallback during the run. Returns the caps it got."""
    caps = []

    def train_run(*args: Any, cap_s: float, **kwargs: Any) -> Any:
        caps.append(cap_s)
        check.STATE["why"] = why
        log = check.common.StepLog(stop_at=0.0)
        now = time.perf_counter()
        log.losses, log.tokens = [2.0] * 4, [10.0] * 4
        log.times = [now + first_step_s + i for i in range(4)]
        return log

    monkeypatch.setattr(check.kernels, "train_run", train_run)
    return caps


def test_a_flex_run_that_fell_back_to_eager_is_a_fail_row(check, monkeypatch) -> None:
    """Same loss as sdpa, but the compiled kernel was not what ran: the check says so."""
    fake_runs(check, monkeypatch, 1.0, why="TritonMissing: Cannot find a working triton")
    want = ("compiled flex fell back to eager: TritonMissing: Cannot find a working triton", "FAIL")
    assert check.kernels.parity(check.state, "flex", "bf16-mixed") == want
    check.state.bf16["sdpa"] = check.state.bf16["flex"]
    assert check.kernels.flex_speed(check.state) == want


def test_flex_runs_share_a_compile_allowance_on_top_of_the_run_cap(check, monkeypatch) -> None:
    caps = fake_runs(check, monkeypatch, first_step_s=50.0)  # 49 s beyond the 1 s pace
    result, status = check.kernels.parity(check.state, "flex", "bf16-mixed")
    assert status == "ok" and "start-up and compile 49s" in result
    assert check.state.flex_compile_left == pytest.approx(41.0, abs=0.5)
    check.kernels.parity(check.state, "flex", "bf16-mixed")
    assert caps[0] == 60.0 + 90.0 and caps[1] == pytest.approx(60.0 + 41.0, abs=0.5)
    check.kernels.parity(check.state, "sdpa", "bf16-mixed")
    assert caps[2] == 60.0  # the other kernels get --run-cap-s only


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
