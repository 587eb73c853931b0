"""`DropoutSchedule`: late dropout (`callbacks.dropout_schedule`).

Every dropout of the model (residual, embedding and source-word `nn.Dropout`, the FFN's
activation dropout and the attention-weight dropout of `MultiHeadAttention`) starts the run at ``start_scale`` x
its configured probability and rises linearly to the configured probability at ``ramp`` of the
run, then stays there. A model that overfits late in a short run learns faster early with
little dropout and is regularised when it would overfit (Liu et al. 2023, "Dropout Reduces
Underfitting", late dropout).

"Of the run" is the same clock the LR schedule reads: the fraction of ``trainer.max_time``
used (Lightning's `Timer`) when the run has a time budget, else ``global_step`` over the
trainer's estimated optimizer steps (``trainer.max_steps`` when set). So on a slower machine the
dropout reaches its value at the same fraction of the budget, like the cosine LR.

The probabilities are set before every training batch from the configured ones, which this
callback reads from the model once per fit: nothing is stored in checkpoints, a resumed run
continues from its restored step or time, and evaluation, decoding and exports see the model
config's values. ``start_scale=1`` (the default) leaves every dropout as configured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning as L
from torch import nn

from litmt.errors import ConfigError
from litmt.models.mha import MultiHeadAttention
from litmt.training.schedules import time_budget_progress

log = logging.getLogger(__name__)


def dropout_scale(progress: float, start_scale: float, ramp: float) -> float:
    """The factor of every configured dropout probability at `progress` (0..1) of the run:
    `start_scale` at 0, rising linearly to 1 at `ramp`, then 1."""
    if progress >= ramp:
        return 1.0
    return start_scale + (1.0 - start_scale) * max(0.0, progress) / ramp


class DropoutSchedule(L.Callback):
    """Scale the model's dropout probabilities by `dropout_scale` before each training batch.

    Args:
        start_scale: factor of the configured probabilities at the start of the run (0..1;
            1 = constant dropout, the callback does nothing).
        ramp: fraction of the run (0 < ramp <= 1) at which the configured probabilities are
            reached.

    Raises:
        ConfigError: `start_scale` outside [0, 1] or `ramp` outside (0, 1].
    """

    def __init__(self, start_scale: float = 1.0, ramp: float = 0.5) -> None:
        if not 0.0 <= float(start_scale) <= 1.0:
            raise ConfigError(
                f"callbacks.dropout_schedule.start_scale must be in [0, 1] (1 = constant "
                f"dropout), got {start_scale}"
            )
        if not 0.0 < float(ramp) <= 1.0:
            raise ConfigError(
                f"callbacks.dropout_schedule.ramp must be in (0, 1] (a fraction of the run), "
                f"got {ramp}"
            )
        self.start_scale, self.ramp = float(start_scale), float(ramp)
        self._base: dict[nn.Module, float] = {}  # each dropout's configured probability
        self._clock: Callable[[], float] | None = None  # the time budget's progress, if any

    @property
    def active(self) -> bool:
        """False when the schedule keeps every probability as configured."""
        return self.start_scale < 1.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active:
            return
        # the configured probabilities, read once (a second fit must not read scaled ones)
        if not self._base:
            for module in pl_module.modules():
                if isinstance(module, nn.Dropout) and module.p > 0:
                    self._base[module] = float(module.p)
                elif isinstance(module, MultiHeadAttention) and module.dropout > 0:
                    self._base[module] = float(module.dropout)
        found = time_budget_progress(trainer)
        self._clock = found[0] if found is not None else None
        clock = "trainer.max_time" if self._clock is not None else "the optimizer steps"
        log.info(
            "dropout schedule: %d dropout(s) start at %.2f x their configured probability and "
            "reach it at %.0f%% of %s",
            len(self._base), self.start_scale, 100 * self.ramp, clock,
        )  # fmt: skip

    def progress(self, trainer: L.Trainer) -> float:
        """The fraction of the run done (0..1): of ``trainer.max_time`` when it is set, else
        of the estimated optimizer steps."""
        if self._clock is not None:
            return self._clock()
        total = max(1, int(trainer.estimated_stepping_batches))
        return min(1.0, trainer.global_step / total)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.active:
            return
        scale = dropout_scale(self.progress(trainer), self.start_scale, self.ramp)
        self._apply(scale)
        pl_module.log("train/dropout_scale", scale, batch_size=batch["src"].size(0))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put back the configured probabilities (a stop before `ramp` leaves scaled ones)."""
        self._apply(1.0)

    def _apply(self, scale: float) -> None:
        """Set every dropout to `scale` x its configured probability."""
        for module, p in self._base.items():
            if isinstance(module, nn.Dropout):
                module.p = p * scale
            else:
                module.dropout = p * scale


__all__ = ["DropoutSchedule", "dropout_scale"]
