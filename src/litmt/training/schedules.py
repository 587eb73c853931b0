"""Learning-rate schedules: warmup then inverse square root, cosine or constant."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Timer

from litmt.errors import ConfigError

log = logging.getLogger(__name__)

SCHEDULERS = ("inverse_sqrt", "cosine", "constant")


def lr_lambda(
    name: str,
    warmup_steps: int,
    total_steps: int | None,
    min_lr_ratio: float = 0.0,
    time_progress: Callable[[], float] | None = None,
) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step `step` (0-based).

    - inverse_sqrt: linear warmup to 1, then sqrt(warmup / step) (Vaswani et al. 2017).
    - cosine: linear warmup, then cosine decay to `min_lr_ratio` at `total_steps`. With
      `time_progress` (a function returning the fraction of the time budget used, 0..1) the
      decay follows the clock instead: min(warmup ramp, cosine(time fraction)), so a run stopped
      by `trainer.max_time` ends at `min_lr_ratio` however many steps the machine managed.
    - constant: linear warmup, then 1.
    """
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler '{name}'; valid names: {', '.join(SCHEDULERS)}")
    warmup = max(1, int(warmup_steps))

    def cosine(progress: float) -> float:
        progress = min(1.0, max(0.0, progress))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def fn(step: int) -> float:
        s = step + 1
        if name == "cosine" and time_progress is not None:
            return min(s / warmup, cosine(time_progress()))
        if s < warmup:
            return s / warmup
        if name == "inverse_sqrt":
            return math.sqrt(warmup / s)
        if name == "cosine":
            total = max(warmup + 1, int(total_steps or 0))
            return cosine((s - warmup) / (total - warmup))
        return 1.0

    return fn


def clock_progress(trainer: Any) -> Callable[[], float] | None:
    """The fraction of the time budget used (0..1), as a function, when the run is bounded by
    ``trainer.max_time`` only (Lightning's `Timer`, no ``max_steps``); else None."""
    if trainer.max_steps > 0:
        return None
    timer = next(
        (c for c in trainer.callbacks if isinstance(c, Timer) and c.time_remaining() is not None),
        None,
    )
    if timer is None:
        return None
    budget = float(timer.time_elapsed()) + float(timer.time_remaining())
    log.info(
        "cosine LR decay follows the time budget trainer.max_time (%.0f s): the LR "
        "reaches min_lr_ratio when the run stops",
        budget,
    )
    return lambda: float(timer.time_elapsed()) / budget
