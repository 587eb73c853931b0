"""Test-only Lightning callbacks (and a recording logger), passed to `scripts/train.py` through
Hydra, e.g.

    +callbacks.record._target_=probe_callbacks.RecordBatches +callbacks.record.out_dir=DIR

(with `tests/helpers` on PYTHONPATH). Every record is one JSON line, flushed and fsynced at once, so
it survives a `kill -9` of the process that wrote it.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from litmt.training.callbacks.validation_bleu import ValidationBleu


class RecordBatches(L.Callback):
    """Writes `<out_dir>/rank<r>.jsonl`: one line per training micro-batch,
    {"epoch", "step" (global step before the batch), "index": [...], "world", "loss" (per
    target token), "lr"},
    one per validation batch {"step", "val_index": [...]} and one per validation
    {"step", "valid_bleu"}."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self._file: Any = None

    def _write(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        if self._file is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.out_dir / f"rank{trainer.global_rank}.jsonl", "a")  # noqa: SIM115
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._pending = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "index": batch["index"].tolist(),
            "world": trainer.world_size,
        }

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs["token_loss"]  # per target token (outputs["loss"] is the summed loss)
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self._write(trainer, {**self._pending, "loss": float(loss), "lr": float(lr)})

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._write(
                trainer, {"step": trainer.global_step, "val_index": batch["index"].tolist()}
            )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        bleu = trainer.callback_metrics.get("valid/bleu")
        if bleu is not None:
            self._write(trainer, {"step": trainer.global_step, "valid_bleu": float(bleu)})


class KillAtStep(L.Callback):
    """Sends `sig` (default SIGKILL, i.e. `kill -9`) to this process when training reaches
    global step `step`, i.e. right after every callback (checkpoints too) handled step `step`."""

    def __init__(self, step: int, sig: str = "SIGKILL") -> None:
        self.step, self.sig = int(step), getattr(signal, sig)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.sig)


class InjectNonFinite(L.Callback):
    """Sets one weight to +inf before the batch of global step `step`: the loss becomes NaN."""

    def __init__(self, step: int) -> None:
        self.step = int(step)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(math.inf)


class InjectNonFiniteGrad(L.Callback):
    """Sets one gradient to NaN after the backward pass of global step `step` (loss finite)."""

    def __init__(self, step: int) -> None:
        self.step = int(step)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step == self.step:
            grad = next(p.grad for p in pl_module.parameters() if p.grad is not None)
            grad.fill_(math.nan)


def degrade(reference: str, quality: float) -> str:
    """`reference` with its first `quality` fraction of words kept and the rest replaced by a
    word no reference has: BLEU rises with `quality`, and equal qualities score equally."""
    words = reference.split()
    keep = round(quality * len(words))
    return " ".join(words[:keep] + ["zzz"] * (len(words) - keep))


class ScriptedScorer(ValidationBleu):
    """The real `ValidationBleu` (gather, sacreBLEU, logging) with scripted hypotheses:
    validation k (1-based, sanity checks not counted) returns every reference degraded to
    `quality[k - 1]`; the test split gets quality 1 (the references themselves)."""

    def __init__(self, quality: list[float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.quality = [float(q) for q in quality]
        self.validations = 0

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validations += 1
        super().on_validation_epoch_start(trainer, pl_module)

    def hypotheses(
        self, pl_module: L.LightningModule, batch: dict[str, Any], split: str = "valid"
    ) -> list[str]:
        testing = pl_module.trainer.testing
        refs = self.references["test" if testing else "valid"]
        quality = 1.0 if testing else self.quality[self.validations - 1]
        return [degrade(refs[i], quality) for i in batch["index"].tolist()]


class RecordTestWeights(L.Callback):
    """Saves the model's state dict at the start of the test stage to `path` (torch.save)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(pl_module.state_dict(), self.path)


class RecordDropout(L.Callback):
    """Writes `path` (JSON): the dropout probabilities the model trains with, per training
    batch ({"step", "dropout": [p of every nn.Dropout with p > 0], "attention": [the
    attention modules' p > 0]}), and once more after `fit` ({"after_fit": ...})."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = []

    @staticmethod
    def _probabilities(module: L.LightningModule) -> dict[str, list[float]]:
        from litmt.models.mha import MultiHeadAttention

        ps = [m.p for m in module.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
        att = [m.dropout for m in module.modules() if isinstance(m, MultiHeadAttention)]
        return {"dropout": ps, "attention": [p for p in att if p > 0]}

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any
    ) -> None:
        self.records.append({"step": trainer.global_step, **self._probabilities(pl_module)})

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.records.append({"after_fit": self._probabilities(pl_module)})
        self.path.write_text(json.dumps(self.records))


class RecordingLogger(Logger):
    """A Lightning logger that appends each `log_hyperparams` call to `path` as one JSON line
    (the values of `sacrebleu/*` keys, the other keys by name)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)

    @property
    def name(self) -> str:
        return "record"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        params = dict(params)
        record = {k: (v if k.startswith("sacrebleu/") else None) for k, v in params.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        return None
