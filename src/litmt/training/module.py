"""`TranslationModule`: the LightningModule that trains a `Seq2SeqTransformer`.

It owns the loss and its logging, and builds the optimiser and the LR schedule from the Hydra
partials of `module.optimizer` and `module.scheduler` (conf/train.yaml holds their defaults).
Validation decoding, the BLEU/chrF scores, their gather over ranks, the W&B heatmap and the
throughput (tokens/s) are callbacks (`litmt.training.callbacks`, configured in
`conf/callbacks/default.yaml`); `forward` is the decoder they call.

Loss normalisation (per token over the whole optimiser step): `litmt.training.losses`.
Non-finite values (stop before the weights change): `litmt.training.grad`.

Shapes: B batch, S source length, T target length, V target vocabulary, N = B*T.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor

from litmt.checkpoint.io import META_KEY, make_meta
from litmt.config import plain
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.runtime.precision import compute_dtype, precision_name
from litmt.training.grad import check_finite, clip_gradients
from litmt.training.losses import label_smoothed_nll
from litmt.training.seeding import step_seed

log = logging.getLogger(__name__)


class TranslationModule(L.LightningModule):
    """Trains a `Seq2SeqTransformer` with label-smoothed, token-normalised cross-entropy.

    Args:
        model_config: a `TransformerConfig` or its dict (vocab sizes filled in from the tokenizer).
        tokenizer: the sentencepiece `Tokenizer` (stored inside every checkpoint; the scoring
            callback decodes with it).
        src_lang, tgt_lang: language codes (stored inside every checkpoint).
        languages: a multilingual model's directions and tag placement
            (`TranslationDataModule.languages_meta`, stored inside every checkpoint).
        optimizer: an optimizer factory taking the parameters (`module.optimizer`, a Hydra
            partial); needed for training only.
        scheduler: an LR-scheduler factory taking (optimizer, trainer)
            (`module.scheduler`: `litmt.training.schedules.warmup_scheduler`, a Hydra
            partial); needed for training only.
        label_smoothing: epsilon of the smoothed loss.
        compile: compile the model in place with `torch.compile` (state-dict keys unchanged).
        seed: re-seed torch's RNG before every training micro-batch from (seed, rank, batch
            number), so dropout is reproducible across a resume; None = never re-seed.
    """

    def __init__(
        self,
        model_config: TransformerConfig | dict[str, Any],
        tokenizer: Tokenizer,
        src_lang: str,
        tgt_lang: str,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        label_smoothing: float = 0.1,
        compile: bool = False,
        seed: int | None = None,
        languages: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model_config, TransformerConfig):
            model_config = TransformerConfig.from_dict(plain(model_config))
        self.model = Seq2SeqTransformer(model_config)
        self.tokenizer, self.src_lang, self.tgt_lang = tokenizer, src_lang, tgt_lang
        if model_config.word_dropout > 0:  # keep bos/eos and every source tag (<2de>, <BT>, ...)
            self.model.exempt_from_word_dropout([BOS_ID, EOS_ID, *tokenizer.src_tags.values()])
        self.languages = dict(plain(languages) or {})
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.label_smoothing = float(label_smoothing)
        self.compile = compile
        self.seed = seed
        # sums over the micro-batches of the current optimiser step (0-d, on the device)
        self._step_tokens: Tensor | None = None
        self._step_loss: Tensor | None = None

    # -- setup ----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Validate the attention backends for the device and precision now, not mid-run."""
        dtype = compute_dtype(self.trainer.precision_plugin)
        self.model.validate_backends(
            self.trainer.strategy.root_device, dtype, training=stage == "fit"
        )
        if self.compile and stage == "fit" and not getattr(self, "_compiled", False):
            self.model.compile(dynamic=True)  # in place: no `_orig_mod.` prefix in checkpoints
            self._compiled = True

    # -- inference --------------------------------------------------------------------------
    def forward(
        self,
        src: Tensor,
        config: DecodeConfig | None = None,
        sync_steps: bool = False,
        prefixes: list[list[int]] | None = None,
    ) -> list[list[int]]:
        """Decode with `litmt.decoding.search.dispatch.decode`: the best hypothesis' target ids per source row.

        Callbacks call it through `trainer.model`, so that a DDP or FSDP wrapper runs it as a
        forward pass (FSDP gathers its sharded root weights only inside one).

        Args:
            src: (B, S) source ids, right-padded.
            config: decoding settings (None = `DecodeConfig`'s defaults).
            sync_steps: every rank runs the same number of decoder steps (under FSDP; see
                `litmt.decoding.search.beam`).
            prefixes: B lists of target ids each output starts with (a multilingual model's
                language token with ``data.tag_placement=target``); None = none.

        Returns:
            B lists of target ids without bos/eos.
        """
        hyps = decode(self.model, src, config, sync_steps=sync_steps, prefixes=prefixes)
        return [h[0].tokens if h else [] for h in hyps]

    # -- training ---------------------------------------------------------------------------
    def _loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        logits = self.model(batch["src"], batch["tgt_in"])  # (B, T, V)
        return label_smoothed_nll(
            logits.flatten(0, 1), batch["tgt_out"].flatten(), self.label_smoothing
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Re-seed the RNG (dropout) from (seed, rank, micro-batch number over the run)."""
        if self.seed is not None:
            total = self.trainer.fit_loop.epoch_loop.total_batch_idx  # restored on resume
            torch.manual_seed(step_seed(self.seed, self.global_rank, total))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """The micro-batch's summed loss (see the module docstring for its normalisation).

        Returns:
            {"loss": summed smoothed loss (0-d, with grad), "token_loss": the same per
            non-pad target token (0-d, detached; what `train/loss` logs)}.
        """
        loss_sum, nll_sum, ntok = self._loss(batch)
        ntok_f = ntok.clamp_min(1).to(loss_sum.dtype)
        detached = loss_sum.detach()
        if self._step_tokens is None or self._step_loss is None:
            self._step_tokens, self._step_loss = ntok.to(loss_sum.dtype), detached
        else:
            self._step_tokens = self._step_tokens + ntok
            self._step_loss = self._step_loss + detached
        token_loss = detached / ntok_f
        bs = batch["src"].size(0)
        self.log("train/loss", token_loss, prog_bar=True, batch_size=bs)
        self.log("train/ppl", torch.exp((nll_sum.detach() / ntok_f).clamp(max=50)), batch_size=bs)
        return {"loss": loss_sum, "token_loss": token_loss}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Turn the accumulated, rank-averaged gradient of summed losses into the gradient of
        (sum of token losses) / (the step's non-pad target tokens on all ranks)."""
        tokens, self._step_tokens = self._step_tokens, None
        if tokens is None:
            return
        # one all-reduce per optimiser step (a no-op in one process)
        tokens = self.trainer.strategy.reduce(tokens, reduce_op="sum")
        factor = self.trainer.accumulate_grad_batches * self.trainer.world_size
        scale = factor / tokens.clamp_min(1)  # 0-d tensor: no host sync
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(scale.to(p.grad.dtype))

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip as configured (FSDP included, see `clip_gradients`), log the norm before
        clipping, and stop on a non-finite norm before the optimiser updates the weights."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = clip_gradients(
            self.trainer.model, params, gradient_clip_val, gradient_clip_algorithm
        )
        self.log("train/grad_norm", norm, batch_size=1)
        loss, self._step_loss = self._step_loss, None
        self.check_finite(norm, loss)

    def check_finite(self, norm: Tensor, loss: Tensor | None) -> None:
        """Raise `LitmtError` on a non-finite gradient norm (`litmt.training.grad.check_finite`)."""
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        check_finite(norm, loss, self.global_step, scaled=scaled)

    def configure_optimizers(self) -> dict[str, Any]:
        """The optimizer and its per-step LR schedule, from the `optimizer` and `scheduler`
        factories (conf/train.yaml `module.optimizer`, `module.scheduler`)."""
        if self.optimizer_factory is None or self.scheduler_factory is None:
            raise ConfigError(
                "TranslationModule needs optimizer= and scheduler= factories to train "
                "(module.optimizer and module.scheduler in conf/train.yaml)"
            )
        optimizer = self.optimizer_factory(self.model.parameters())
        scheduler = self.scheduler_factory(optimizer, self.trainer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"},
        }

    # -- validation / test (loss only; decoding and BLEU are `litmt.training.callbacks`) -------------
    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        loss_sum, nll_sum, ntok = self._loss(batch)
        ntok_f = ntok.clamp_min(1).to(loss_sum.dtype)
        n = int(ntok)
        self.log(f"{split}/loss", loss_sum / ntok_f, batch_size=n, sync_dist=True)
        self.log(f"{split}/nll", nll_sum / ntok_f, batch_size=n, sync_dist=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "valid")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    # -- checkpoints ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Make the checkpoint self-contained: model config, tokenizer bytes, languages."""
        checkpoint[META_KEY] = make_meta(
            self.model.config, self.tokenizer, self.src_lang, self.tgt_lang, self.languages
        )
        # the training precision, so that inference can pick the same compute dtype
        checkpoint[META_KEY]["precision"] = precision_name(self.trainer.precision_plugin)
