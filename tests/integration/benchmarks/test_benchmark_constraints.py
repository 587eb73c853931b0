"""benchmarks/benchmark_constraints.py runs end to end on a barely trained tiny model (whose
outputs miss reference words, so there are terms to place) and reports them met."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_checkpoint, corpus

REPO = Path(__file__).resolve().parents[3]


def _data(tmp_path: Path, n: int = 12) -> list[str]:
    en, de = corpus(seed=1)
    (tmp_path / "t.en").write_text("\n".join(en[:n]) + "\n", encoding="utf-8")
    (tmp_path / "t.de").write_text("\n".join(de[:n]) + "\n", encoding="utf-8")
    return ["--src", str(tmp_path / "t.en"), "--ref", str(tmp_path / "t.de")]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_constraints", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_terms_from_the_references_are_met_at_every_beam(tmp_path):
    """A barely trained model misses reference words, so there are terms to place: each one
    is met (or its sentence flagged), at beam 2 and beam 4, with a markdown row per search."""
    ckpt = build_tiny_checkpoint(tmp_path, steps=12)
    run = _run(["--ckpt", str(ckpt), *_data(tmp_path), "--beams", "2", "4",
                "--prefix-lines", "0", "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    c = result["constraints"]
    assert c["constraints"] > c["constrained_sentences"] > 0  # 2 terms on some sentences
    assert [r["beam"] for r in c["beams"]] == [2, 4]
    for r in c["beams"]:
        assert r["met_or_flagged"] == c["constraints"], r
        assert r["found_exact"] == c["constraints"] and r["missed"] == [], r
    assert result["prefix"] is None
    for row in ("| greedy (the terms' source) |", "| beam 2 + terms (DBA) |", "| beam 4 |"):
        assert row in run.stdout, run.stdout


def test_terms_are_the_rarest_missing_reference_words():
    from collections import Counter

    from benchmarks.benchmark_constraints import pick_constraints

    freq = Counter({"Hund": 5, "Katze": 1, "rennt": 2, "Ein": 9})
    assert pick_constraints("Ein Hund.", "Ein Hund rennt, Katze!", 2, freq) == ["Katze", "rennt"]
    assert pick_constraints("Ein Hund rennt.", "Ein Hund rennt.", 2, freq) == []


def test_prefix_part_keeps_prefixes_on_both_engines(tmp_path):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    ckpt = build_tiny_checkpoint(tmp_path, steps=12)
    run = _run(["--ckpt", str(ckpt), *_data(tmp_path), "--beams", "2", "--prefix-lines", "6",
                "--exports", str(tmp_path / "ct2"), "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert run.returncode == 0, run.stderr
    p = json.loads((tmp_path / "r.json").read_text())["prefix"]
    assert p["start_with_prefix_torch"] == p["start_with_prefix_ct2"] == p["lines"] == 6
    assert p["full_reference_prefix"]["torch"]["starts_with_ids"] == 6


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
