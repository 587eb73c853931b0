"""`RunLengthEstimate`: a run with no ``trainer.max_time`` says early how long it will take.

After `after_steps` optimizer steps it logs one line: at the speed measured so far, the time
the run's ``max_epochs`` (or ``max_steps``) will take. A run with ``trainer.max_time`` stops on
the clock and says so itself; there this callback does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer

log = logging.getLogger(__name__)


def hours_text(seconds: float) -> str:
    """``"about 3.2 h"`` / ``"about 14 min"``."""
    return f"about {seconds / 3600:.1f} h" if seconds >= 3600 else f"about {seconds / 60:.0f} min"


class RunLengthEstimate(L.Callback):
    """Log the run's expected length once, after `after_steps` optimizer steps."""

    def __init__(self, after_steps: int = 50) -> None:
        self.after_steps = after_steps
        self._start: float | None = None
        self._start_step = 0
        self._done = False

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._start is None:
            self._start, self._start_step = time.monotonic(), trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._done or self._start is None:
            return
        if any(isinstance(c, Timer) for c in trainer.callbacks):  # max_time: on the clock
            self._done = True
            return
        steps = trainer.global_step - self._start_step
        if steps < self.after_steps:
            return
        self._done = True
        per_step = (time.monotonic() - self._start) / steps
        per_epoch = trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)
        total = trainer.max_steps if trainer.max_steps > 0 else None
        if total is None and trainer.max_epochs and trainer.max_epochs > 0:
            total = int(per_epoch * trainer.max_epochs) if per_epoch != float("inf") else None
        if not total:
            return
        left = max(0, total - trainer.global_step) * per_step
        log.info(
            "at %.2f s per step, the run's %d steps (%s) take %s more (training only; "
            "validation adds to it); cap it with trainer.max_time=DD:HH:MM:SS",
            per_step,
            total,
            f"max_steps={trainer.max_steps}"
            if trainer.max_steps > 0
            else f"max_epochs={trainer.max_epochs}",
            hours_text(left),
        )
