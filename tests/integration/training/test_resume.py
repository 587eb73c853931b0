"""Fault tolerance: exact resume after `kill -9` and SIGTERM, and a NaN loss stops cleanly.

The reference is an uninterrupted run with the same seed. A resumed run must continue at the
checkpoint's global step with the same batches (example indexes), the same learning rate and
the same losses. The probe callbacks (tests/helpers/probe_callbacks.py) are passed through Hydra.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from train_utils import compose_train, run_train_script, tiny_overrides, write_toy_corpus

from litmt.checkpoint.io import load_checkpoint
from litmt.cli.train import EXIT_SIGTERM, train
from litmt.errors import LitmtError

MAX_STEPS, EVERY = 12, 4
RECORD = "+callbacks.record._target_=probe_callbacks.RecordBatches"


def overrides(corpus: Path, out: Path, run: str) -> list[str]:
    """A tiny run of MAX_STEPS steps (~4 batches an epoch), a checkpoint every EVERY steps."""
    over = [o for o in tiny_overrides(corpus, out) if not o.startswith("hydra.run.dir")]
    return [
        *over,
        f"hydra.run.dir={out / run}",
        "trainer.max_epochs=-1",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.log_every_n_steps=1",
        f"callbacks.model_checkpoint.every_n_train_steps={EVERY}",
        "module.scheduler.warmup_steps=8",  # the LR changes every step: checks the schedule
        "module.optimizer.lr=2e-3",
        "test_after_training=false",
        RECORD,
        f"+callbacks.record.out_dir={out / run / 'record'}",
    ]


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "record" / "rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if '"loss"' in line]


def compose_run(corpus: Path, out: Path, run: str, *extra: str) -> DictConfig:
    """The in-process config of `overrides` + `extra`, writing to out/run (no Hydra job)."""
    over = [*overrides(corpus, out, run), *extra]
    cfg = compose_train([o for o in over if not o.startswith("hydra.")], out)
    cfg.paths.output_dir = str(out / run)
    return cfg


def train_until_sigterm_at_step_5(corpus: Path, out: Path, run: str, *extra: str) -> dict:
    """Train run `run` in process with SIGTERM at step 5: it exits 143; returns last.ckpt."""
    kill = ["+callbacks.kill._target_=probe_callbacks.KillAtStep", "+callbacks.kill.step=5"]
    cfg = compose_run(corpus, out, run, *extra, *kill, "+callbacks.kill.sig=SIGTERM")
    with pytest.raises(SystemExit) as exc:
        train(cfg)
    assert exc.value.code == EXIT_SIGTERM
    return load_checkpoint(out / run / "checkpoints" / "last.ckpt")


def assert_continues(resumed: list[dict], reference: list[dict], start: int) -> None:
    """`resumed` (from global step `start`) equals the reference run's steps start.. ."""
    assert resumed[0]["step"] == start, f"resumed at step {resumed[0]['step']}, not {start}"
    ref = [r for r in reference if r["step"] >= start]
    assert [r["step"] for r in resumed] == [r["step"] for r in ref]
    for got, want in zip(resumed, ref, strict=True):
        assert got["epoch"] == want["epoch"] and got["index"] == want["index"], got["step"]
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-12), got["step"]
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-4), got["step"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A toy corpus and an uninterrupted reference run (subprocess, like the resumed ones)."""
    out = tmp_path_factory.mktemp("resume")
    corpus = write_toy_corpus(out / "corpus", {"train": 200, "valid": 8, "test": 8})
    proc = run_train_script(overrides(corpus, out, "reference"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return corpus, out


@pytest.mark.slow
def test_kill_9_then_resume_continues_exactly(workspace: tuple[Path, Path]) -> None:
    corpus, out = workspace
    reference = records(out / "reference")
    assert [r["step"] for r in reference] == list(range(MAX_STEPS))
    over = overrides(corpus, out, "killed")
    killed = run_train_script(
        [*over, "+callbacks.kill._target_=probe_callbacks.KillAtStep", "+callbacks.kill.step=6"]
    )
    assert killed.returncode == -9, killed.stderr[-3000:]  # kill -9 at the start of step 6
    last = out / "killed" / "checkpoints" / "last.ckpt"
    saved_step = load_checkpoint(last)["global_step"]
    assert 0 < saved_step <= 6
    before = records(out / "killed")
    assert before == reference[: len(before)]  # identical up to the kill

    resumed = run_train_script(over)  # the same command: auto-resume from last.ckpt
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_continues(records(out / "killed")[len(before) :], reference, saved_step)
    assert load_checkpoint(last)["global_step"] == MAX_STEPS


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_then_resumes(workspace: tuple[Path, Path]) -> None:
    corpus, out = workspace
    over = overrides(corpus, out, "preempted")
    kill = ["+callbacks.kill._target_=probe_callbacks.KillAtStep", "+callbacks.kill.step=5"]
    proc = run_train_script([*over, *kill, "+callbacks.kill.sig=SIGTERM"])
    assert proc.returncode == EXIT_SIGTERM, proc.stderr[-3000:]
    assert "stopped by SIGTERM at step 6" in proc.stderr
    # step 5 was not a checkpoint step (EVERY=4): the file holds the SIGTERM save after it
    last = out / "preempted" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 6
    n_before = len(records(out / "preempted"))
    resumed = run_train_script(over)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_continues(records(out / "preempted")[n_before:], records(out / "reference"), 6)


def test_nan_loss_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 6, "test": 6})
    over = overrides(corpus, tmp_path, "nan")
    inject = ["+callbacks.nan._target_=probe_callbacks.InjectNonFinite", "+callbacks.nan.step=5"]
    proc = run_train_script([*over, *inject])
    assert proc.returncode == 2, proc.stderr[-3000:]
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: the training loss became nan at step 5; stopped before")
    assert "Traceback" not in proc.stderr
    ckpt = load_checkpoint(tmp_path / "nan" / "checkpoints" / "last.ckpt")
    assert 0 < ckpt["global_step"] <= 5  # the last save before the failure, untouched
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


def test_nan_gradients_stop_before_the_update(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 6, "test": 6})
    inject = [
        "+callbacks.nan._target_=probe_callbacks.InjectNonFiniteGrad",
        "+callbacks.nan.step=5",
    ]
    cfg = compose_run(corpus, tmp_path, "nan_grad", *inject)
    with pytest.raises(
        LitmtError, match=r"^the gradients became non-finite \(norm nan\) at step 5;"
    ):
        train(cfg)
    ckpt = load_checkpoint(tmp_path / "nan_grad" / "checkpoints" / "last.ckpt")
    assert 0 < ckpt["global_step"] <= 5
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


def test_sigterm_in_process_saves_at_the_step_and_exits_143(tmp_path: Path) -> None:
    """Fast variant of the SIGTERM test (the signal goes to this pytest process, where the
    callback's handler is installed for the duration of `fit`)."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 6, "test": 6})
    assert train_until_sigterm_at_step_5(corpus, tmp_path, "term")["global_step"] == 6


def test_resume_in_process_continues_exactly(tmp_path: Path) -> None:
    """Fast variant: stop at step 8 (max_steps; last.ckpt at 8), resume the run dir to 12."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 6, "test": 6})

    def run(name: str, max_steps: int) -> list[dict]:
        train(compose_run(corpus, tmp_path, name, f"trainer.max_steps={max_steps}"))
        return records(tmp_path / name)

    reference = run("reference", MAX_STEPS)
    first = run("stopped", 2 * EVERY)
    assert first == reference[: 2 * EVERY]
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 2 * EVERY
    both = run("stopped", MAX_STEPS)
    assert_continues(both[len(first) :], reference, 2 * EVERY)
    assert load_checkpoint(last)["global_step"] == MAX_STEPS


def test_sigterm_mid_accumulation_saves_after_the_whole_optimizer_step(tmp_path: Path) -> None:
    """With 2 micro-batches per step, SIGTERM at the first micro-batch of step 5 waits for
    the second one: last.ckpt holds 6 whole steps, and both micro-batches of step 5 ran."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 6, "test": 6})
    ckpt = train_until_sigterm_at_step_5(
        corpus, tmp_path, "accum", "trainer.accumulate_grad_batches=2"
    )
    assert ckpt["global_step"] == 6
    steps = [r["step"] for r in records(tmp_path / "accum")]
    assert steps == [s for s in range(6) for _ in range(2)]  # 2 micro-batches per step
