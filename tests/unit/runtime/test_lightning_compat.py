"""One test per Lightning internal that `litmt.runtime.lightning_compat` wraps: when a Lightning
release renames or changes one of them, the test of that function fails here."""

from __future__ import annotations

import signal
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litmt.runtime.lightning_compat import (
    set_received_sigterm,
    sigterm_handlers_besides_lightning,
    uses_distributed_sampler,
)


def trainer(**kwargs: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_set_received_sigterm_is_what_the_training_loop_reads() -> None:
    """Setting the flag after batch 1 makes Lightning stop there with SIGTERMException."""

    class SetAtBatch(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 1:
                set_received_sigterm(trainer, True)

    t = trainer(max_steps=10, limit_val_batches=0, callbacks=[SetAtBatch()])
    assert t.received_sigterm is False
    with pytest.raises(SIGTERMException):
        t.fit(BoringModel())
    assert t.received_sigterm is True and t.global_step == 2
    set_received_sigterm(t, False)
    assert t.received_sigterm is False


def test_sigterm_handlers_besides_lightning_keep_the_users_and_drop_the_notifier() -> None:
    """Inside `fit`, SIGTERM's handler is Lightning's composition of its notifier and the
    handler installed before `fit`; the wrapper returns the latter only."""

    def users_handler(signum: int, frame: Any) -> None:
        return None

    seen: dict[str, Any] = {}

    class Inspect(L.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            current = signal.getsignal(signal.SIGTERM)
            seen["installed"] = current
            seen["others"] = sigterm_handlers_besides_lightning(trainer, current)

    previous = signal.signal(signal.SIGTERM, users_handler)
    try:
        trainer(max_steps=1, limit_val_batches=0, callbacks=[Inspect()]).fit(BoringModel())
        assert signal.getsignal(signal.SIGTERM) is users_handler  # restored at teardown
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen["installed"] is not users_handler  # Lightning had composed its own
    assert seen["others"] == [users_handler]
    assert sigterm_handlers_besides_lightning(trainer(), users_handler) == []  # not composed


@pytest.mark.parametrize("value", [True, False])
def test_uses_distributed_sampler_reads_the_trainer_argument(value: bool) -> None:
    assert uses_distributed_sampler(trainer(use_distributed_sampler=value)) is value
