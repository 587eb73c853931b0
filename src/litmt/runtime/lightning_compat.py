"""The few Lightning internals litmt needs, in one place (Lightning 2.6; pinned in pyproject).

Lightning has no public API for these three things, so each one is wrapped here, with a test
per function in `tests/unit/runtime/test_lightning_compat.py`. When Lightning changes one of them, that
test fails and this file is the only one to fix.

- `set_received_sigterm`: Lightning reads the flag through the public `Trainer.received_sigterm`
  property, but only its `_SignalConnector` can set it
  (lightning/pytorch/trainer/connectors/signal_connector.py, `_SignalConnector`).
- `sigterm_handlers_besides_lightning`: the handlers Lightning composed into its SIGTERM handler
  (`_SignalConnector.register_signal_handlers` wraps them in `_HandlersCompose`), minus its own
  notifier `_sigterm_notifier_fn`, which broadcasts inside the signal handler.
- `uses_distributed_sampler`: the `Trainer(use_distributed_sampler=...)` argument is kept only by
  the accelerator connector (`_AcceleratorConnector.use_distributed_sampler`; read by
  `_DataConnector._requires_distributed_sampler`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

SignalHandler = Callable[[int, Any], Any] | int | signal.Handlers | None


def set_received_sigterm(trainer: L.Trainer, value: bool) -> None:
    """Set the flag behind `trainer.received_sigterm`: True makes Lightning raise
    `SIGTERMException` after the current training batch (`_TrainingEpochLoop.advance`)."""
    trainer._signal_connector.received_sigterm = bool(value)


def sigterm_handlers_besides_lightning(
    trainer: L.Trainer, handler: SignalHandler
) -> list[SignalHandler]:
    """The SIGTERM handlers inside `handler` (the one installed now) other than Lightning's
    notifier: SLURM's bypass handler and any handler the user had installed before `fit`.

    Returns [] when `handler` is not Lightning's composed handler (nothing to keep).
    """
    if not isinstance(handler, _HandlersCompose):
        return []
    notifier = trainer._signal_connector._sigterm_notifier_fn
    return [h for h in handler.signal_handlers if h != notifier]


def uses_distributed_sampler(trainer: L.Trainer) -> bool:
    """The trainer's `use_distributed_sampler` argument (True: Lightning swaps in a
    `DistributedSampler` when the run is distributed)."""
    return bool(trainer._accelerator_connector.use_distributed_sampler)
