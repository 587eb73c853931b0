"""A run without a time limit says how long it will take: up front on a machine without a GPU
(`litmt.cli.train.cpu_advice`, with the recipe that fits a CPU) and, after its first steps,
at the speed it measured (`RunLengthEstimate`)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import Timer
from omegaconf import OmegaConf

from litmt.cli.train import cpu_advice
from litmt.training.callbacks.run_length import RunLengthEstimate, hours_text


def config(**trainer):
    base = {"accelerator": "auto", "max_epochs": 100, "max_time": None, "max_steps": -1}
    return OmegaConf.create({"trainer": {**base, **trainer}, "model": {"d_model": 256}})


def test_the_cpu_advice_names_the_recipe_and_its_length() -> None:
    line = cpu_advice(config(), cuda=False)
    assert line is not None and "\n" not in line
    assert "up to 100 epochs of a d_model=256 model" in line
    assert "experiment=multi30k_cpu" in line
    assert "(58 minutes of training)" in line  # read from conf/experiment/multi30k_cpu.yaml


@pytest.mark.parametrize(
    ("cuda", "trainer"),
    [
        (True, {}),  # a GPU trains
        (False, {"max_time": "00:01:00:00"}),  # the clock caps it
        (False, {"fast_dev_run": True}),
        (False, {"limit_train_batches": 2}),
        (False, {"max_steps": 100}),
    ],
)
def test_no_advice_where_the_run_is_bounded_or_on_a_gpu(cuda: bool, trainer: dict) -> None:
    assert cpu_advice(config(**trainer), cuda=cuda) is None


def test_cpu_forced_on_a_gpu_machine_still_gets_the_advice() -> None:
    assert cpu_advice(config(accelerator="cpu"), cuda=True) is not None


def fake_trainer(step: int, **kw):
    base = dict(global_step=step, callbacks=[], max_steps=-1, max_epochs=10,
                num_training_batches=200, accumulate_grad_batches=1)  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_the_estimate_is_logged_once_after_n_steps(monkeypatch, caplog) -> None:
    clock = iter([100.0, 110.0])  # the start, then 10 s later at step 50
    monkeypatch.setattr("litmt.training.callbacks.run_length.time.monotonic", lambda: next(clock))
    cb = RunLengthEstimate(after_steps=50)
    cb.on_train_batch_start(fake_trainer(0))
    with caplog.at_level(logging.INFO, logger="litmt.training.callbacks.run_length"):
        cb.on_train_batch_end(fake_trainer(49))  # not yet
        assert not caplog.records
        cb.on_train_batch_end(fake_trainer(50))  # 0.2 s per step, 2000 steps: 1950 left
        cb.on_train_batch_end(fake_trainer(51))  # once only
    (record,) = caplog.records
    assert "0.20 s per step" in record.message and "2000 steps (max_epochs=10)" in record.message
    assert "take about 6 min more" in record.message  # 1950 x 0.2 s = 390 s


def test_a_run_on_the_clock_gets_no_estimate(monkeypatch, caplog) -> None:
    monkeypatch.setattr("litmt.training.callbacks.run_length.time.monotonic", lambda: 1.0)
    cb = RunLengthEstimate(after_steps=1)
    on_clock = [Timer(duration="00:00:05:00")]  # what Lightning adds for trainer.max_time
    cb.on_train_batch_start(fake_trainer(0, callbacks=on_clock))
    with caplog.at_level(logging.INFO):
        cb.on_train_batch_end(fake_trainer(5, callbacks=on_clock))
    assert not caplog.records


def test_hours_text() -> None:
    assert hours_text(390) == "about 6 min" and hours_text(3 * 3600 + 720) == "about 3.2 h"
