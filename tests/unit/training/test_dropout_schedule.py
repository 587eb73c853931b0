"""Late dropout (`callbacks.dropout_schedule`): the factor's shape, its clock (the time budget
or the steps), the config errors, and a real training run in which every dropout of the model
ramps from start_scale x its configured value to the value and is put back after `fit`."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import Timer
from train_utils import compose_train, tiny_overrides, write_toy_corpus

from litmt.cli.train import train
from litmt.errors import ConfigError
from litmt.training.callbacks.dropout_schedule import DropoutSchedule, dropout_scale


def test_the_factor_rises_linearly_from_start_scale_to_one_at_ramp_then_stays() -> None:
    assert dropout_scale(0.0, 0.25, 0.5) == pytest.approx(0.25)
    assert dropout_scale(0.25, 0.25, 0.5) == pytest.approx(0.625)
    assert dropout_scale(0.5, 0.25, 0.5) == 1.0
    assert dropout_scale(0.9, 0.25, 0.5) == 1.0
    assert dropout_scale(0.3, 0.0, 1.0) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_scale": 1.5}, "start_scale must be in [0, 1]"),
        ({"start_scale": -0.1}, "start_scale must be in [0, 1]"),
        ({"ramp": 0.0}, "ramp must be in (0, 1]"),
        ({"ramp": 1.2}, "ramp must be in (0, 1]"),
    ],
)
def test_bad_settings_are_refused_with_the_config_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=r"callbacks\.dropout_schedule\.") as err:
        DropoutSchedule(**kwargs)
    assert message in str(err.value)


def test_the_clock_is_the_time_budget_when_the_trainer_has_one(monkeypatch) -> None:
    schedule = DropoutSchedule(start_scale=0.5, ramp=0.5)
    timer = Timer(duration=timedelta(seconds=100))
    monkeypatch.setattr(timer, "time_elapsed", lambda *a: 25.0)
    monkeypatch.setattr(timer, "time_remaining", lambda *a: 75.0)
    steps = SimpleNamespace(callbacks=[], global_step=9, estimated_stepping_batches=10)
    timed = SimpleNamespace(
        callbacks=[timer], global_step=9, estimated_stepping_batches=10, world_size=1
    )
    module = SimpleNamespace(modules=lambda: [])
    schedule.on_fit_start(timed, module)
    assert schedule.progress(timed) == pytest.approx(0.25)  # 25 s of 100, not step 9 of 10
    schedule.on_fit_start(steps, module)
    assert schedule.progress(steps) == pytest.approx(0.9)


@pytest.fixture(scope="module")
def scheduled_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """12 optimizer steps of the tiny model with every dropout on, start_scale 0.25, ramp 0.5."""
    out = tmp_path_factory.mktemp("dropsched")
    corpus = write_toy_corpus(out / "corpus", {"train": 120, "valid": 8, "test": 4})
    overrides = [
        *tiny_overrides(corpus, out),
        "trainer.max_steps=12",
        "trainer.max_epochs=100",
        "trainer.limit_val_batches=0",  # no validation: only the schedule is tested
        "test_after_training=false",
        "model.dropout=0.4",
        "model.activation_dropout=0.2",
        "model.attention_dropout=0.1",
        "attention=math",
        "callbacks.dropout_schedule.start_scale=0.25",
        "callbacks.dropout_schedule.ramp=0.5",
        "+callbacks.zrecord._target_=probe_callbacks.RecordDropout",
        f"+callbacks.zrecord.path={out / 'dropout.json'}",
    ]
    train(compose_train(overrides, out))
    return json.loads((out / "dropout.json").read_text())


def test_every_dropout_ramps_from_start_scale_to_its_value_over_the_first_half(
    scheduled_run: list[dict],
) -> None:
    steps = [r for r in scheduled_run if "step" in r]
    assert [r["step"] for r in steps] == list(range(12))
    configured = scheduled_run[-1]["after_fit"]
    assert set(configured["dropout"]) == {0.4, 0.2}  # residual/embedding and FFN dropouts
    assert configured["attention"] and set(configured["attention"]) == {0.1}
    for r in steps:
        factor = dropout_scale(r["step"] / 12, 0.25, 0.5)  # the steps clock: max_steps=12
        assert r["dropout"] == pytest.approx([p * factor for p in configured["dropout"]])
        assert r["attention"] == pytest.approx([p * factor for p in configured["attention"]])
    first, last = steps[0], steps[-1]
    assert first["dropout"][0] == pytest.approx(0.25 * 0.4)
    assert last["dropout"] == configured["dropout"]  # reached at step 6 of 12, then kept


def test_start_scale_one_leaves_the_configured_dropout(tmp_path: Path) -> None:
    """The shipped default (start_scale 1.0) touches nothing."""
    cfg = compose_train(["model=tiny"], tmp_path)
    assert cfg.callbacks.dropout_schedule.start_scale == 1.0
    schedule = DropoutSchedule()
    assert not schedule.active
