"""Learning-rate schedules: warmup then inverse square root, cosine or constant.

`warmup_scheduler` is what `module.scheduler` in conf/train.yaml instantiates (a Hydra partial;
every default is in that YAML); the module calls it with the optimizer and the trainer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.callbacks import Timer

from litmt.errors import ConfigError

log = logging.getLogger(__name__)

SCHEDULERS = ("inverse_sqrt", "cosine", "constant")
HORIZONS = ("steps", "time")


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


def warmup_scheduler(
    optimizer: torch.optim.Optimizer,
    trainer: Any,
    *,
    name: str,
    warmup_steps: int,
    min_lr_ratio: float,
    total_steps: int | None,
    horizon: str,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The `lr_lambda` schedule of `optimizer`, stepped once per optimizer step.

    Args:
        optimizer: the optimizer whose base LR the schedule multiplies.
        trainer: the Lightning trainer (its step budget or its time budget).
        name, warmup_steps, min_lr_ratio: see `lr_lambda`.
        total_steps: the cosine's step horizon; None = ``trainer.max_steps``, else Lightning's
            estimate of the run's optimizer steps.
        horizon: ``steps`` (the cosine decays over `total_steps`) or ``time`` (it decays over
            ``trainer.max_time``, `clock_progress`). Read by the cosine schedule only.

    Raises:
        ConfigError: an unknown name or horizon, or ``horizon=time`` without ``trainer.max_time``.
    """
    if horizon not in HORIZONS:
        raise ConfigError(
            f"module.scheduler.horizon={horizon!r} is not one of {', '.join(HORIZONS)}"
        )
    time_progress = None
    if name == "cosine" and horizon == "time":
        time_progress = clock_progress(trainer)
    elif name == "cosine" and not total_steps:
        total_steps = int(trainer.estimated_stepping_batches)  # max_steps when it is set
    fn = lr_lambda(name, warmup_steps, total_steps, min_lr_ratio, time_progress)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def time_budget_progress(trainer: Any) -> tuple[Callable[[], float], float] | None:
    """(the fraction of ``trainer.max_time`` used (0..1) as a function, the budget in seconds),
    read from Lightning's `Timer` (which the trainer adds for ``max_time`` and which survives
    a resume); None when the trainer has no time budget.

    With several processes, every call broadcasts rank 0's elapsed time, so all ranks see the
    same progress (the same LR and dropout; replicas stay identical). Lightning's `Timer` does
    the same for its stop flag after every batch. Every rank must therefore call the function
    at the same points (the LR scheduler's step and per-batch callbacks do).
    """
    timer = next(
        (c for c in trainer.callbacks if isinstance(c, Timer) and c.time_remaining() is not None),
        None,
    )
    if timer is None:
        return None
    budget = float(timer.time_elapsed()) + float(timer.time_remaining())

    def progress() -> float:
        elapsed = float(timer.time_elapsed())
        if trainer.world_size > 1:
            elapsed = float(trainer.strategy.broadcast(elapsed, src=0))
        return elapsed / budget

    return progress, budget


def clock_progress(trainer: Any) -> Callable[[], float]:
    """`time_budget_progress` for the cosine LR decay.

    Raises:
        ConfigError: the trainer has no ``max_time``.
    """
    found = time_budget_progress(trainer)
    if found is None:
        raise ConfigError(
            "module.scheduler.horizon=time decays the LR over trainer.max_time, which is not "
            "set; set trainer.max_time=DD:HH:MM:SS or use module.scheduler.horizon=steps"
        )
    progress, budget = found
    log.info(
        "cosine LR decay follows the time budget trainer.max_time (%.0f s): the LR "
        "reaches min_lr_ratio when the run stops",
        budget,
    )
    return progress
