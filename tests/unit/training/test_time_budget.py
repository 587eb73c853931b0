"""A run stopped by the clock (`trainer.max_time`) keeps one checkpoint of its last weights:
`StopAtTimeBudget` stops right after the validation the budget ran out in, and the end step
(`finalize.best_checkpoints`) counts checkpoints with equal weights once."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import Timer
from tiny_checkpoint import other_weights, tiny_checkpoint_path
from train_utils import compose_train, tiny_overrides, write_toy_corpus

import litmt.cli.train
from litmt.checkpoint.io import load_checkpoint
from litmt.cli.train import train
from litmt.training.finalize import best_checkpoints

BUDGET_S = 12


class SpendBudgetInFirstValidation(L.Callback):
    """Sleeps through what is left of ``trainer.max_time`` in the first validation after
    training started: the budget then runs out during a validation at an epoch's end, as a
    minutes-long CPU validation does near the end of a real run."""

    def __init__(self) -> None:
        self.done = False

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.done or trainer.sanity_checking:
            return
        self.done = True
        (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
        time.sleep(float(timer.time_remaining()) + 0.5)


def clock_stopped_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Path:
    """A tiny run with a 12 s budget spent in its first validation; its checkpoints folder."""
    real = litmt.cli.train.build_trainer

    def with_spender(cfg: Any, callbacks: list[Any], *args: Any) -> L.Trainer:
        return real(cfg, [*callbacks, SpendBudgetInFirstValidation()], *args)

    monkeypatch.setattr(litmt.cli.train, "build_trainer", with_spender)
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 20, "test": 20})
    cfg = compose_train(
        [
            *tiny_overrides(corpus, tmp_path),
            f"trainer.max_time=00:00:00:{BUDGET_S:02d}",
            "trainer.max_epochs=50",
            "callbacks.model_checkpoint.save_top_k=-1",  # keep every validation's checkpoint
            "test_after_training=false",
            *extra,
        ],
        tmp_path,
    )
    train(cfg)
    return tmp_path / "run" / "checkpoints"


def saved_steps(checkpoints: Path) -> list[int]:
    return sorted(int(load_checkpoint(p)["global_step"]) for p in checkpoints.glob("best-*.ckpt"))


def test_a_clock_stop_during_validation_keeps_one_checkpoint(tmp_path, monkeypatch):
    steps = saved_steps(clock_stopped_run(tmp_path, monkeypatch))
    # the budget ran out in the first epoch's validation: the run stops there, no extra step
    assert len(steps) == 1, steps
    assert (
        load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == steps[0]
    )


@pytest.mark.slow
def test_without_the_stop_the_clock_validation_saves_a_second_checkpoint(tmp_path, monkeypatch):
    """The control: Lightning alone takes one more step, stops on its Timer and validates
    again, so two checkpoints one step apart are kept (the reported best-step006175/6176)."""
    steps = saved_steps(clock_stopped_run(tmp_path, monkeypatch, "callbacks.time_budget=null"))
    assert len(steps) == 2 and steps[1] == steps[0] + 1, steps


@pytest.fixture
def tiny_ckpt_dir(tmp_path, tmp_path_factory):
    """Two checkpoints of one tiny model with different weights, in `tmp_path`."""
    first = tmp_path / "best-step000001-bleu9.00.ckpt"
    shutil.copy(tiny_checkpoint_path(tmp_path_factory), first)
    return first, other_weights(first, tmp_path / "best-step000003-bleu5.00.ckpt", seed=1)


def test_the_average_counts_equal_weights_once(tiny_ckpt_dir):
    """A copy of a checkpoint under another name (the same weights saved twice) is skipped:
    the n best are n different sets of weights."""
    first, second = tiny_ckpt_dir
    twin = first.with_name("best-step000002-bleu9.00.ckpt")
    shutil.copy(first, twin)
    kept = {str(first): 9.0, str(twin): 9.0, str(second): 5.0}
    assert best_checkpoints(kept, 2) == [str(first), str(second)]
    assert best_checkpoints(kept, 3) == [str(first), str(second)]  # fewer when only 2 differ
