"""checks/prefix_parity.py runs end to end on the committed legacy fixture (a checkpoint and
its CTranslate2 export) and finds the two engines' n-best lists identical for every kind of
prefix; a wrong export is refused with one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "legacy_v0_1"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks.prefix_parity", "--ckpt", str(FIXTURE / "tiny.ckpt"),
         "--threads", "1", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


@pytest.fixture
def test_files(tmp_path) -> tuple[Path, Path]:
    en, de = corpus(seed=3)
    (tmp_path / "t.en").write_text("\n".join(en[:40]) + "\n", encoding="utf-8")
    (tmp_path / "t.de").write_text("\n".join(de[:40]) + "\n", encoding="utf-8")
    return tmp_path / "t.en", tmp_path / "t.de"


def test_prefix_parity_lists_are_identical_for_every_kind(tmp_path, test_files):
    src, ref = test_files
    run = _run("--ct2", str(FIXTURE / "ct2"), "--src", str(src), "--ref", str(ref),
               "--json", str(tmp_path / "r.json"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    kinds = json.loads((tmp_path / "r.json").read_text())["kinds"]
    assert [k["kind"] for k in kinds] == ["2 words", "half", "whole"]
    for k in kinds:
        assert k["lines"] == 40 and k["identical_lists"] == 40 and k["differences"] == []
    assert "| whole | 40 / 40 | 40 | 0 | 0 | 0 | 0 |" in run.stdout


def test_an_export_of_another_checkpoint_is_refused_with_one_line(tmp_path, test_files):
    other = tmp_path / "other"
    shutil.copytree(FIXTURE / "ct2", other)
    meta = json.loads((other / "litmt.json").read_text())
    meta["checkpoint_sha256"] = "0" * 64
    (other / "litmt.json").write_text(json.dumps(meta))
    src, ref = test_files
    run = _run("--ct2", str(other), "--src", str(src), "--ref", str(ref))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: --ct2 {other} is not an export of --ckpt {FIXTURE / 'tiny.ckpt'}"
    ]
