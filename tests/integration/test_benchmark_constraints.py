"""benchmarks/benchmark_constraints.py runs end to end on a barely trained tiny model (whose
outputs miss reference words, so there are constraints to place) and reports them met."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_checkpoint, corpus

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

REPO = Path(__file__).resolve().parents[2]


def test_constraints_benchmark_places_every_constraint_and_keeps_prefixes(tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path, steps=12)  # weak: it misses reference words
    en, de = corpus(seed=1)
    (tmp_path / "t.en").write_text("\n".join(en[:12]) + "\n", encoding="utf-8")
    (tmp_path / "t.de").write_text("\n".join(de[:12]) + "\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_constraints", "--ckpt", str(ckpt),
         "--src", str(tmp_path / "t.en"), "--ref", str(tmp_path / "t.de"),
         "--prefix-lines", "6", "--exports", str(tmp_path / "ct2"),
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    c = result["constraints"]
    assert c["constraints"] > 0 and c["missed"] == []
    assert c["found_as_substring"] == c["constraints"]
    p = result["prefix"]
    assert p["start_with_prefix_torch"] == p["start_with_prefix_ct2"] == p["lines"] == 6
    assert p["full_reference_prefix"]["torch"]["starts_with_ids"] == 6
    assert "| beam 5 + constraints (DBA) |" in run.stdout


def test_mismatched_source_and_reference_is_one_line_exit_2(tmp_path):
    (tmp_path / "a.en").write_text("A dog.\nA cat.\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("Ein Hund.\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_constraints", "--ckpt", "missing.ckpt",
         "--src", str(tmp_path / "a.en"), "--ref", str(tmp_path / "a.de")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["error: 2 source lines but 1 references"]
