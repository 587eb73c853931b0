"""`ValidationBleu`: validation and test decoding, sacreBLEU's BLEU and chrF on the hypotheses
gathered from every rank, logged as `valid/bleu`, `valid/chrf` (and `test/...`).

A multilingual model (`data.directions`) is scored per direction, ``valid/bleu_en-de``,
``valid/chrf_en-de``, ...; ``valid/bleu`` and ``valid/chrf`` are then the means over the
directions (what selects checkpoints), so each direction counts equally whatever its size.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy
from torch import Tensor

from litmt.decoding.config import decoding_options
from litmt.metrics import corpus_scores
from litmt.runtime.fp8 import fp8_disabled

log = logging.getLogger(__name__)


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


def lockstep(strategy: Strategy) -> bool:
    """Whether every rank must run the same number of decoder steps (``sync_steps``): under
    more than one process with a strategy that shards parameters (FSDP, `ModelParallelStrategy`,
    DeepSpeed ZeRO-3), each decoder layer all-gathers its weights on every call, so a rank
    whose sentences finish first would leave the others waiting in their all-gathers."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    sharded = isinstance(strategy, FSDPStrategy | ModelParallelStrategy)
    return sharded or bool(getattr(strategy, "zero_stage_3", False))


class ValidationBleu(L.Callback):
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
        self.spans: dict[str, list[tuple[str, int, int]] | None] = {}  # per-direction indices
        self._forced: dict[str, Any] = {}  # split -> (indices -> forced target ids) or absent
        self.signature_logged = False

    def hypotheses(
        self, pl_module: L.LightningModule, batch: dict[str, Tensor], split: str = "valid"
    ) -> list[str]:
        """Detokenised hypotheses of one batch (B,) with this callback's decoding settings.

        Decodes through `trainer.model` (the DDP/FSDP wrapper when there is one; every rank
        calls it once per batch), i.e. `TranslationModule.forward`; in lock step (`lockstep`)
        when the strategy shards parameters.
        """
        trainer = pl_module.trainer
        forced = self._forced.get(split)  # a multilingual model's forced language token
        extra = {} if forced is None else {"prefixes": forced(batch["index"].tolist())}
        ids = trainer.model(
            batch["src"], self.decode_config, sync_steps=lockstep(trainer.strategy), **extra
        )
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
        spans = getattr(dm, "direction_spans", None)
        self.spans[split] = spans(split) if spans is not None else None
        forced = getattr(dm, "forced_prefixes", None)
        if forced is not None and forced(split, []) is not None:
            self._forced[split] = lambda indices, s=split: forced(s, indices)

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
            hyps = self.hypotheses(pl_module, batch, split)
        index = batch["index"].tolist()
        self._pairs[split].extend(zip(index, hyps, strict=True))

    def _end(self, trainer: L.Trainer, pl_module: L.LightningModule, split: str) -> None:
        if split not in self._pairs:
            return
        hyps = gather_hypotheses(self._pairs.pop(split), len(self.references[split]))
        if hyps is None:
            log.info("%s: only part of the split was decoded; no corpus BLEU", split)
            return
        refs = self.references[split]
        scores = corpus_scores(hyps, refs, metrics=("bleu", "chrf"))
        bleu, chrf = scores["bleu"].score, scores["chrf"].score
        spans = self.spans.get(split)
        if spans:
            per = {
                name: corpus_scores(hyps[a:b], refs[a:b], metrics=("bleu", "chrf"))
                for name, a, b in spans
            }
            # every rank has the same hypotheses, hence the same score: no sync needed
            for name, s in per.items():
                pl_module.log(f"{split}/bleu_{name}", s["bleu"].score, rank_zero_only=False)
                pl_module.log(f"{split}/chrf_{name}", s["chrf"].score, rank_zero_only=False)
                log.info("%s BLEU %s: %.2f", split, name, s["bleu"].score)
            bleu = sum(s["bleu"].score for s in per.values()) / len(per)
            chrf = sum(s["chrf"].score for s in per.values()) / len(per)
        # every rank has the same hypotheses, hence the same score: no sync needed
        pl_module.log(f"{split}/bleu", bleu, prog_bar=True, rank_zero_only=False)
        pl_module.log(f"{split}/chrf", chrf, rank_zero_only=False)
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
        self, trainer: L.Trainer, pl_module: L.LightningModule, _: Any, batch: Any, *__: Any
    ) -> None:
        self._batch(trainer, pl_module, batch, "valid")

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, _: Any, batch: Any, *__: Any
    ) -> None:
        self._batch(trainer, pl_module, batch, "test")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "valid")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "test")


# -- attention heatmaps ---------------------------------------------------------------------
