"""Lightning callbacks of litmt runs (`conf/callbacks/default.yaml`; `litmt.train` adds
`PreemptionCheckpoint` to every run).

`TranslationScorer`: validation and test decoding, sacreBLEU's BLEU and chrF on the hypotheses
gathered from every rank, logged as `valid/bleu`, `valid/chrf` (and `test/...`).

`AttentionHeatmap`: one cross-attention heatmap per validation, to W&B.

`PreemptionCheckpoint`: a preempted job (SLURM, Kubernetes, `kill <pid>`) gets SIGTERM and
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
internals it needs are wrapped in `litmt.lightning_compat`.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from litmt.decoding import decoding_options
from litmt.errors import LitmtError
from litmt.lightning_compat import set_received_sigterm, sigterm_handlers_besides_lightning
from litmt.metrics import corpus_scores
from litmt.precision import fp8_disabled

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

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
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


# -- validation decoding and corpus scores ----------------------------------------------------


def gather_hypotheses(pairs: list[tuple[int, str]], n_refs: int) -> list[str] | None:
    """Every rank's (example index, hypothesis) pairs, de-duplicated and in corpus order.

    Collective under `torch.distributed` (every rank must call it); the same result on every
    rank.

    Args:
        pairs: this rank's (index in the split, detokenised hypothesis) pairs.
        n_refs: the number of references (sentences) in the split.

    Returns:
        n_refs hypotheses in index order, or None when some index is missing (a partial run,
        e.g. `limit_val_batches`): no corpus score then.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[tuple[int, str]] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, pairs)
        pairs = [p for part in gathered for p in (part or [])]
    by_index = dict(pairs)  # duplicates padded in by a distributed sampler collapse here
    if n_refs == 0 or any(i not in by_index for i in range(n_refs)):
        return None
    return [by_index[i] for i in range(n_refs)]


class TranslationScorer(L.Callback):
    """Decodes the validation and test sets, scores them with sacreBLEU (`litmt.metrics`) and
    logs `<split>/bleu` and `<split>/chrf` (what `ModelCheckpoint` and `EarlyStopping` monitor).

    Each rank decodes its own batches; the hypotheses of all ranks are gathered by example
    index before scoring, so the score equals a one-process evaluation. The sacreBLEU
    signatures go to every logger once, as hyperparameters. References come from the
    datamodule's `references(split)` (`TranslationDataModule`).

    Args:
        splits: the evaluation splits to score ("valid", "test").
        decode: decoding settings, `DecodeConfig` fields (e.g. ``beam_size=1``); absent or
            None keys keep `DecodeConfig`'s defaults.
    """

    def __init__(self, splits: Sequence[str] = ("valid", "test"), **decode: Any) -> None:
        self.decode_config = decoding_options(None, decode)
        self.splits = tuple(splits)
        self.references: dict[str, list[str]] = {}
        self._pairs: dict[str, list[tuple[int, str]]] = {}
        self.signature_logged = False

    def hypotheses(self, pl_module: L.LightningModule, batch: dict[str, Tensor]) -> list[str]:
        """Detokenised hypotheses of one batch (B,) with this callback's decoding settings.

        Decodes through `trainer.model` (the DDP/FSDP wrapper when there is one; every rank
        calls it once per batch), i.e. `TranslationModule.forward`.
        """
        ids = pl_module.trainer.model(batch["src"], self.decode_config)
        return pl_module.tokenizer.decode_tgt(ids)

    def _start(self, trainer: L.Trainer, split: str) -> None:
        self._pairs.pop(split, None)
        if split not in self.splits or trainer.sanity_checking:
            return
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "references"):
            log.warning("no datamodule with references(split): %s BLEU is not computed", split)
            return
        self.references[split] = dm.references(split)
        self._pairs[split] = []

    def _batch(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: dict[str, Tensor],
        split: str,
    ) -> None:
        if split not in self._pairs:
            return
        plugin = trainer.precision_plugin
        context = plugin.val_step_context() if split == "valid" else plugin.test_step_context()
        with context, fp8_disabled():  # B x 1 decode rows break FP8 GEMMs' multiple-of-8 rule
            hyps = self.hypotheses(pl_module, batch)
        index = batch["index"].tolist()
        self._pairs[split].extend(zip(index, hyps, strict=True))

    def _end(self, trainer: L.Trainer, pl_module: L.LightningModule, split: str) -> None:
        if split not in self._pairs:
            return
        hyps = gather_hypotheses(self._pairs.pop(split), len(self.references[split]))
        if hyps is None:
            log.info("%s: only part of the split was decoded; no corpus BLEU", split)
            return
        scores = corpus_scores(hyps, self.references[split], metrics=("bleu", "chrf"))
        # every rank has the same hypotheses, hence the same score: no sync needed
        pl_module.log(f"{split}/bleu", scores["bleu"].score, prog_bar=True, rank_zero_only=False)
        pl_module.log(f"{split}/chrf", scores["chrf"].score, rank_zero_only=False)
        if not self.signature_logged:
            self.signature_logged = True
            signatures = {
                "sacrebleu/bleu_signature": scores["bleu"].signature,
                "sacrebleu/chrf_signature": scores["chrf"].signature,
            }
            for lg in trainer.loggers:  # Lightning loggers write on rank 0 only
                lg.log_hyperparams(signatures)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, "valid")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, "test")

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, Tensor],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch(trainer, pl_module, batch, "valid")

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, Tensor],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch(trainer, pl_module, batch, "test")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "valid")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "test")


# -- attention heatmaps ---------------------------------------------------------------------


class AttentionHeatmap(L.Callback):
    """After each validation, logs the cross-attention heatmap of one fixed validation
    sentence to W&B (`valid/cross_attention`); does nothing without a `WandbLogger`.

    Args:
        sentence: the index of the validation source sentence to draw.
    """

    def __init__(self, sentence: int = 0) -> None:
        self.sentence = int(sentence)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        from lightning.pytorch.loggers import WandbLogger
        from torch.distributed.fsdp import FullyShardedDataParallel

        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        dm = trainer.datamodule
        if not wandb_loggers or dm is None or not hasattr(dm, "sources"):
            return
        if isinstance(trainer.model, FullyShardedDataParallel):
            # rank 0 alone cannot run the model: FSDP shards the weights over every rank
            log.info("no attention heatmap under FSDP (the weights are sharded)")
            return
        sources = dm.sources("valid")
        if self.sentence >= len(sources):
            return
        import matplotlib.pyplot as plt

        from litmt.visualize import cross_attention_figure

        try:
            # outside the step hooks Lightning runs no autocast: enter the precision plugin's
            # own (Precision.forward_context, lightning/pytorch/plugins/precision/precision.py)
            # so that a half-only kernel (flash, te) gets its dtype
            with trainer.precision_plugin.forward_context():
                fig = cross_attention_figure(
                    pl_module.model, pl_module.tokenizer, sources[self.sentence]
                )
        except LitmtError as exc:  # e.g. an attention backend that cannot return weights
            log.warning("skipping the attention heatmap: %s", exc)
            return
        wandb_loggers[0].log_image("valid/cross_attention", images=[fig], step=trainer.global_step)
        plt.close(fig)
