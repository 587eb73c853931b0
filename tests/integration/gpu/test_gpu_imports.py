"""Every gpu-marked test and scripts/gpu_check.py import without hydra, omegaconf, datasets
and wandb, which the GPU image lacks (docs/guide/scale.md#gpu-check).

Each check runs in a subprocess under tests/helpers/without_packages.py (a sys.meta_path
finder that raises ModuleNotFoundError for the four), so the blocking cannot leak into this
process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from train_utils import REPO, script_env

BLOCK = [sys.executable, "tests/helpers/without_packages.py"]


def collect(prefix: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`pytest -m gpu --collect-only` under `prefix`; the collected node ids."""
    cmd = [*prefix, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider"]
    cmd += extra
    proc = subprocess.run(cmd, cwd=REPO, env=script_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    return proc, {line for line in proc.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_every_gpu_test_is_collected_without_the_four_packages() -> None:
    full, expected = collect([sys.executable])
    assert full.returncode == 0, full.stdout[-3000:]
    assert expected, "no gpu-marked tests found"
    # Modules without gpu tests may import Hydra: their collection errors are allowed, as
    # long as every gpu-marked test is still collected.
    blocked, got = collect(BLOCK, "--continue-on-collection-errors")
    assert "No module named" in blocked.stdout  # the blocking did happen
    errored = [line for line in blocked.stdout.splitlines() if line.startswith("ERROR ")]
    assert sorted(expected - got) == [], "\n".join(errored)
    assert got == expected


@pytest.mark.slow
def test_gpu_check_help_runs_without_the_four_packages() -> None:
    proc = subprocess.run([*BLOCK, "scripts/gpu_check.py", "--help"], cwd=REPO,
                          env=script_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--deadline-s" in proc.stdout and "--dry-run" in proc.stdout


@pytest.mark.slow
def test_the_blocker_blocks(tmp_path) -> None:
    script = tmp_path / "imports.py"
    script.write_text("import lightning.pytorch\nimport omegaconf\n")  # Lightning probes omegaconf
    proc = subprocess.run([*BLOCK, str(script)], cwd=REPO, env=script_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: No module named 'omegaconf' (blocked)"
    )
