"""reports/student_table.py runs end to end on the tiny model: a checkpoint row (exported in
int8) and an export-directory row, both test sets of the data directory, the parameter count,
the goal lines (the same weights in every role: each comparison is +0.00 and says so), the
result record, and one-line refusals for a float32 export and a missing path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus, tiny_checkpoint_path
from tiny_corpora import write_splits

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from litmt.deploy.export.ct2 import export_model

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    data = tmp_path_factory.mktemp("data")
    en, de = corpus(seed=5)
    write_splits(data, en, de, {"test2016": slice(0, 12), "test2017": slice(12, 20)})
    (data / "test_only_source.en").write_text("a dog\n", encoding="utf-8")  # no .de: not a test set
    return tiny_checkpoint_path(tmp_path_factory), data


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reports.student_table", "--threads", "1", "--reps", "1", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_table_rows_goals_and_json(setup, tmp_path):
    ckpt, data = setup
    export = export_model(ckpt, tmp_path / "student-int8", quantization="int8")
    run = _run(
        "--model", f"teacher={ckpt}", "--model", f"student={export}", "--data-dir", str(data),
        "--exports", str(tmp_path / "exports"), "--teacher", "teacher", "--student", "student",
        "--reference-student", "teacher", "--born-again", "student",
        "--json", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "t.json").read_text())
    rows = result["rows"]
    assert [(r["model"], r["split"], r["beam"]) for r in rows] == [
        (m, s, b) for m in ("teacher", "student") for s in ("test2016", "test2017") for b in (1, 5)
    ]
    assert {r["sentences"] for r in rows if r["split"] == "test2017"} == {8}
    teacher_export = tmp_path / "exports" / "teacher" / "int8"  # the checkpoint, exported
    assert rows[0]["export"] == str(teacher_export)
    files = [f for f in export.rglob("*") if f.is_file()]
    assert rows[-1]["bytes"] == sum(f.stat().st_size for f in files) > 0
    # the same weights in both rows: the same translations, so the same scores
    for a, b in zip(rows[:4], rows[4:], strict=True):
        assert (a["bleu"], a["chrf"]) == (b["bleu"], b["chrf"])
    from litmt.checkpoint.load import load_model

    n = sum(p.numel() for p in load_model(ckpt).model.parameters())
    assert {r["parameters"] for r in rows} == {n}
    goals = result["goals"]
    assert len(goals) == 5 and "% of the teacher's" in goals[1]
    assert "+0.00 BLEU (goal >= -1.00: met)" in goals[0]
    assert f"{n:,} parameters against {n:,} (goal: fewer: missed)" in goals[0]
    assert "distilled vs reference-trained student, beam 1: +0.00 BLEU" in goals[2]
    assert goals[4] == "- born-again student vs teacher, beam 5: +0.00 BLEU (goal >= +0.50: missed)"
    assert "| student | test2017 | 5 |" in run.stdout


def test_a_float32_export_is_refused_in_one_line(setup, tmp_path):
    ckpt, data = setup
    export = export_model(ckpt, tmp_path / "f32", quantization="none")
    run = _run("--model", f"a={export}", "--data-dir", str(data))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: {export} is not an int8 export (quantization=none); the table compares int8 "
        "exports"
    ]


def test_a_missing_model_is_refused_in_one_line(setup, tmp_path):
    _, data = setup
    run = _run("--model", f"a={tmp_path / 'nothing'}", "--data-dir", str(data))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: --model a={tmp_path / 'nothing'}: no checkpoint or ct2 export there"
    ]
