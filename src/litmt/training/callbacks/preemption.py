"""`PreemptionCheckpoint`: a preempted job (SLURM, Kubernetes, `kill <pid>`) gets SIGTERM and
should leave a checkpoint it can resume from. Lightning 2.x installs its own SIGTERM handler
in `trainer.fit`: it sets `trainer.received_sigterm`, forwards the signal to the processes it
launched, and after the current batch raises `SIGTERMException` (in DDP on every rank together:
rank 0's flag is broadcast before each step). It saves nothing, and its handler runs a
collective inside the signal handler, which breaks DDP (`on_train_start` replaces it with a
handler that only sets a flag). This callback saves `last.ckpt` (the file auto-resume looks
for) in `on_train_batch_end` of the optimizer step during which the signal arrived: the point
where `ModelCheckpoint(every_n_train_steps=...)` saves, which resumes
exactly. A SIGTERM that arrives during validation lets the validation finish (stopping
mid-validation would leave the other ranks waiting, and a mid-validation checkpoint would resume
without the hypotheses already decoded) and saves after the next training step. The Lightning
internals it needs are wrapped in `litmt.runtime.lightning_compat`.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litmt.runtime.lightning_compat import set_received_sigterm, sigterm_handlers_besides_lightning

log = logging.getLogger(__name__)


def last_checkpoint_path(trainer: L.Trainer) -> Path:
    """`<ModelCheckpoint dirpath>/last.ckpt`, else `<default_root_dir>/checkpoints/last.ckpt`."""
    cb = trainer.checkpoint_callback
    if isinstance(cb, ModelCheckpoint) and cb.dirpath:
        return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
    return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"


class PreemptionCheckpoint(L.Callback):
    """On SIGTERM during `fit`, save `last.ckpt` at the end of the current optimizer step (all
    ranks take part), then let Lightning stop the run.

    Args:
        path: where to save; None = `last_checkpoint_path(trainer)`.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.saved: Path | None = None
        self._pending = False  # rank 0 got SIGTERM; save at the next optimizer step boundary
        self._forwarded = False
        self._stepped = False  # the optimizer stepped during the current batch

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Swap Lightning's SIGTERM notifier for one without collectives.

        Lightning 2.6's notifier calls `dist.broadcast` inside the signal handler, which can
        interleave with a collective the interrupted rank was about to run (gloo reports
        "collective mismatch"; NCCL may hang). This one sets the flag on rank 0 only and
        forwards the signal to the processes Lightning launched; the flag is broadcast from
        rank 0 at a fixed point of every step instead (`on_train_batch_end`, then Lightning's
        own check before the next step), so all ranks stop after the same step. Lightning
        restores the original handlers at teardown.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        # handlers Lightning composed after its notifier (SLURM's, the user's)
        others = sigterm_handlers_besides_lightning(trainer, signal.getsignal(signal.SIGTERM))

        def notify(signum: int, frame: FrameType | None) -> None:
            if trainer.global_rank == 0:
                # only rank 0's flag counts (it is broadcast): a flag set on another rank
                # first would make that rank alone stop at Lightning's end-of-batch check
                if not self._forwarded and trainer.strategy.launcher is not None:
                    trainer.strategy.launcher.kill(signum)  # forward once to launched processes
                    self._forwarded = True
                if trainer.validating or trainer.sanity_checking:
                    # Lightning would stop rank 0 alone mid-validation: finish it, then save
                    # after the next training step
                    self._pending = True
                else:
                    set_received_sigterm(trainer, True)
            for handler in others:
                if callable(handler):
                    handler(signum, frame)

        signal.signal(signal.SIGTERM, notify)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._stepped = False

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._stepped = True  # this batch ends an optimizer step (not mid accumulation)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if self.saved is not None:
            return
        pending = self._pending or trainer.received_sigterm
        if dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            flag = torch.tensor([int(pending)], device=pl_module.device)
            dist.broadcast(flag, src=0)  # rank 0 decides, as in Lightning's own check
            pending = bool(flag.item())
        if not pending:
            return
        if not self._stepped:
            # mid gradient accumulation: hide the flag from Lightning's loop until the
            # optimizer step, so that the checkpoint holds a whole step
            self._pending = True
            set_received_sigterm(trainer, False)
            return
        path = Path(self.path) if self.path else last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # the same point as ModelCheckpoint(every_n_train_steps)
        self.saved, self._pending = path, False
        set_received_sigterm(trainer, True)  # Lightning now stops with SIGTERMException
        if trainer.is_global_zero:
            log.warning(
                "SIGTERM: saved %s at step %d; rerun with the same hydra.run.dir to resume",
                path,
                trainer.global_step,
            )

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or self.saved is not None:
            return
        if trainer.state.fn == TrainerFn.FITTING and trainer.is_global_zero:
            log.warning(
                "SIGTERM outside a training step: no new checkpoint; resume from %s",
                last_checkpoint_path(trainer),
            )
