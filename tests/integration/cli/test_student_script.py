"""scripts/student.py end to end on a toy corpus with tiny models: every stage's output, a rerun
that skips every stage, a changed setting refused in one line, an interrupted stage rerun.

Slow (four trainings and exports in subprocesses: minutes on 2 busy cores); the stage and
marker logic is tests/unit/cli/test_student.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from train_utils import REPO, script_env, write_toy_corpus

pytestmark = pytest.mark.slow

TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "data.tokenizer.vocab_size=64"]


def train_overrides(cache: Path, *more: str) -> str:
    """A training stage's overrides as the Hydra list value of *_overrides (tiny and quick)."""
    over = [*TINY, f"data.cache_dir={cache}", "data.max_tokens=512", "data.splits.test=test",
            "logger=csv", "trainer.max_epochs=3", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "module.scheduler.warmup_steps=5",
            "finalize.length_penalties=[1.0]", *more]  # fmt: skip
    return "[" + ", ".join(json.dumps(o) for o in over) + "]"


def pipeline(corpus: Path, out: Path, cache: Path, *more: str) -> subprocess.CompletedProcess:
    args = [
        f"data.dir={corpus}",
        f"out={out}",
        # the teacher learns enough of the toy lexicon in ~100 steps to say something
        "teacher_overrides="
        + train_overrides(
            cache, "model.n_decoder_layers=2", "data.max_tokens=128", "trainer.max_epochs=8"
        ),
        "student_overrides=" + train_overrides(cache),
        "distill_overrides=" + json.dumps([f"ct2_cache_dir={cache / 'ct2'}", "max_ratio=inf"]),
        *more,
    ]
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "student.py"), *args],
        capture_output=True, text=True, cwd=REPO, env=script_env(), timeout=1200,
    )  # fmt: skip


def stage_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("stage ")]


def test_the_pipeline_runs_skips_refuses_and_resumes(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 200, "valid": 20, "test": 20})
    out, cache = tmp_path / "run", tmp_path / "cache"
    first = pipeline(corpus, out, cache)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = stage_lines(first.stderr)
    for n, name in enumerate(("teacher", "distill", "student", "export"), 1):
        assert f"stage {n}/4 {name}: run -> " in "\n".join(lines), lines
        assert f"stage {n}/4 {name}: done in " in "\n".join(lines), lines
    assert (out / "teacher" / "scores.json").is_file()
    kd = out / "distilled"
    assert (kd / "train.en").is_file() and (kd / "train.de").is_file()
    provenance = json.loads((kd / "distill.json").read_text(encoding="utf-8"))
    assert provenance["source"]["dir"] == str(corpus) and provenance["counts"]["kept"] > 0
    # the student trained on the distilled split and the original one (mix_references, the
    # default), validated on the original corpus
    saved = yaml.safe_load((out / "student" / ".hydra" / "config.yaml").read_text())
    assert saved["data"]["splits"]["train"] == str(kd / "train")
    assert [extra["dir"] for extra in saved["data"]["extra_train"]] == [str(corpus)]
    assert saved["data"]["dir"] == str(corpus)
    assert (out / "student" / "scores.json").is_file()
    meta = json.loads((out / "exports" / "student-int8" / "litmt.json").read_text())
    assert meta["quantization"] == "int8"
    shape = [meta["model_config"][k] for k in ("d_model", "n_encoder_layers", "n_decoder_layers")]
    assert shape == [32, 6, 2]  # the student recipe's depth with the tiny width
    assert (out / "exports" / "student.argosmodel").stat().st_size > 0

    again = pipeline(corpus, out, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert stage_lines(again.stderr) == [
        f"stage 1/4 teacher: skipped, done in {out / 'teacher'}",
        f"stage 2/4 distill: skipped, done in {kd}",
        f"stage 3/4 student: skipped, done in {out / 'student'}",
        f"stage 4/4 export: skipped, done in {out / 'exports'}",
    ]

    changed = pipeline(corpus, out, cache, "mix_references=false")
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines()[-1] == (
        f"error: {out} holds a student stage run with other settings (differs in: "
        "mix_references); rerun with those settings, or choose another out= directory"
    )

    # a student stage killed mid-training: its marker still says running
    marker = out / ".stages" / "student.json"
    state = json.loads(marker.read_text(encoding="utf-8"))
    marker.write_text(json.dumps({**state, "state": "running"}), encoding="utf-8")
    (out / ".stages" / "distill.json").unlink()  # a lost marker: the stage runs again
    resumed = pipeline(corpus, out, cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = stage_lines(resumed.stderr)
    assert lines[0] == f"stage 1/4 teacher: skipped, done in {out / 'teacher'}"
    assert lines[1] == f"stage 2/4 distill: run -> {kd}"
    assert "already distilled" in resumed.stderr  # distill.py's own resume: nothing redone
    assert f"stage 3/4 student: resumed (interrupted before) -> {out / 'student'}" in lines
    assert "resuming from" in resumed.stderr + resumed.stdout  # train.py found last.ckpt
    assert lines[-1] == f"stage 4/4 export: skipped, done in {out / 'exports'}"
