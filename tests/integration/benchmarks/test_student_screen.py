"""reports/student_screen.py on the tiny teacher, without training: the forced-length decode of
a random-weight shape gives each sentence the length asked; the table's rows (the teacher's
beam 5 and greedy, its own shape as the calibration, each shape with its estimate, parameters,
size and verdict); a shape with its own vocabulary; the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus, tiny_checkpoint_path
from tiny_corpora import write_splits

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from litmt.checkpoint.io import META_KEY, load_checkpoint
from litmt.deploy.engines.ct2 import CT2Translator
from reports.student_screen import forced_decoder
from reports.student_sizes import random_export

REPO = Path(__file__).resolve().parents[3]
SMALL = "d_model=32,n_heads=2,d_ff=64,n_encoder_layers=3,n_decoder_layers=1"


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    data = tmp_path_factory.mktemp("data")
    en, de = corpus(seed=5)
    write_splits(data, en, de, {"test2016": slice(0, 12), "train": slice(12, 400)})
    return tiny_checkpoint_path(tmp_path_factory), data


def test_the_forced_decode_gives_each_sentence_its_length(setup, tmp_path) -> None:
    ckpt, data = setup
    meta = load_checkpoint(ckpt)[META_KEY]
    _, export = random_export(meta, dict(meta["model_config"]), tmp_path)
    student = CT2Translator(export, device="cpu", compute_type="int8", threads=1)
    sources = [*(data / "test2016.en").read_text(encoding="utf-8").splitlines()[:6], ""]
    lengths = [3, 9, 1, 17, 9, 0, 5]  # an empty output and an empty source: left out
    count, decode = forced_decoder(student, sources, lengths)
    assert count == 5
    assert sorted(decode()) == sorted((n, n) for n in (3, 9, 1, 17, 9))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reports.student_screen", "--threads", "1", "--reps", "1", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_the_table_rows_estimates_and_verdicts(setup, tmp_path) -> None:
    ckpt, data = setup
    run = _run(
        "--teacher", str(ckpt), "--data-dir", str(data), "--exports", str(tmp_path / "exports"),
        "--shape", SMALL, "--shape", f"{SMALL},vocab_size=60", "--corpus", str(data),
        "--json", str(tmp_path / "screen.json"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "screen.json").read_text())["rows"]
    assert [(r["model"], r["decode"]) for r in rows] == [
        ("teacher", "beam 5"),
        ("teacher", "greedy"),
        ("teacher shape", "greedy, random weights, forced lengths"),
        (SMALL, "greedy, random weights, forced lengths"),
        (f"{SMALL},vocab_size=60", "greedy, random weights, forced lengths"),
    ]
    teacher_beam5, teacher_greedy, calibration = rows[0]["rate"], rows[1]["rate"], rows[2]
    assert calibration["rate"] == pytest.approx(teacher_greedy)  # the calibration's own row
    sentences = 12
    offset = sentences / teacher_greedy - calibration["forced_seconds"]
    for row in rows[3:]:
        assert row["forced_rate"] == pytest.approx(sentences / row["forced_seconds"])
        estimate = sentences / (row["forced_seconds"] + offset)
        assert row["rate"] == pytest.approx(estimate)
        assert row["x_beam5"] == pytest.approx(estimate / teacher_beam5)
        assert row["passes"] == (row["x_beam5"] >= 3.0)
    assert rows[3]["parameters"] < calibration["parameters"]
    assert rows[4]["parameters"] < rows[3]["parameters"]  # 60 pieces instead of the teacher's 80
    verdicts = {"keep" if r["passes"] else "drop" for r in rows[3:]}
    table = [line for line in run.stdout.splitlines() if line.startswith(f"| {SMALL}")]
    assert len(table) == 2 and all(line.split("|")[-2].strip() in verdicts for line in table)


def test_user_errors_are_one_line(setup, tmp_path) -> None:
    ckpt, data = setup
    bad = _run("--teacher", str(ckpt), "--data-dir", str(data), "--shape", "d_model")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --shape 'd_model': expected KEY=VALUE pairs separated by commas"
    ]
    vocab = _run("--teacher", str(ckpt), "--data-dir", str(data), "--shape", "vocab_size=60")
    assert vocab.returncode == 2
    assert vocab.stderr.strip().splitlines() == [
        "error: a --shape sets vocab_size: give --corpus DIR (its train.{src,tgt})"
    ]
