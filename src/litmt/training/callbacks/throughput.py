"""`Throughput`: logs `train/tok_per_s`, the non-pad target tokens trained per second."""

from __future__ import annotations

import time
from typing import Any

import lightning as L


class Throughput(L.Callback):
    """Log `train/tok_per_s` after every training micro-batch but an epoch's first: the batch's
    non-pad target tokens (``batch["ntokens"]``, a Python int: no device sync) over the
    wall-clock time since the previous micro-batch ended.

    Args:
        prog_bar: also show the rate in the progress bar.
    """

    def __init__(self, prog_bar: bool) -> None:
        self.prog_bar = prog_bar
        self._tick: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._tick = None  # the time between epochs (validation, data setup) is not training

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        now = time.perf_counter()
        if self._tick is not None and "ntokens" in batch:
            rate = int(batch["ntokens"]) / max(now - self._tick, 1e-9)
            pl_module.log(
                "train/tok_per_s", rate, prog_bar=self.prog_bar, batch_size=batch["src"].size(0)
            )
        self._tick = now
