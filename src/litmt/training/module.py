"""`TranslationModule`: the LightningModule that trains a `Seq2SeqTransformer`.

It owns the loss, the optimiser, the LR schedule and the logging. Validation decoding, the
BLEU/chrF scores, their gather over ranks and the W&B heatmap are callbacks
(`litmt.callbacks`, configured in `conf/callbacks/default.yaml`); `forward` is the decoder
they call.

Loss normalisation (fairseq's and Sockeye's choice): the gradient of one optimiser step is

    sum of the label-smoothed token losses / number of non-pad target tokens

over *all* the micro-batches (`trainer.accumulate_grad_batches`) and ranks of that step, so the
update does not depend on how a token budget was split into batches, accumulation steps or
processes. `training_step` returns its micro-batch's summed loss; Lightning divides it by
`accumulate_grad_batches` (`ClosureResult.from_training_step_output` in
lightning/pytorch/loops/optimization/automatic.py) and DDP and FSDP average the gradients over
the `world_size` ranks. `on_before_optimizer_step` undoes both: it multiplies the gradients by
`accumulate_grad_batches * world_size / step_tokens`, where `step_tokens` (the step's non-pad
target tokens) is all-reduced once per optimiser step, not per micro-batch. The logged
`train/loss` stays per token (of each micro-batch). Under fp16 loss scaling ("16-mixed") the
summed loss makes the first steps overflow until the scaler has lowered its scale by about the
token count (some log2(tokens per step) skipped steps, as with fairseq's summed losses); the
scaled gradients are then the same as with a mean loss. bf16 and fp32 are unaffected.

Non-finite values (fairseq's check): `configure_gradient_clipping` gets the global gradient
norm from the clipping itself (`clip_grad_norm_` returns it; with clipping off the norm is
computed alone) and reads it once per optimiser step. It needs no all-reduce of its own: DDP
gradients are equal on every rank, and FSDP's `clip_grad_norm_` reduces the shard norms, so all
ranks see the same norm and stop together. A non-finite norm raises `LitmtError` before the
optimiser updates the weights, except under "16-mixed", whose scaler skips such steps itself
(a non-finite loss raises there too).

Shapes: B batch, S source length, T target length, V target vocabulary, N = B*T.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Timer
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import Tensor, nn

from litmt.checkpoint import META_KEY, make_meta
from litmt.data.tokenizer import PAD_ID, Tokenizer
from litmt.decoding import DecodeConfig, decode
from litmt.errors import ConfigError, LitmtError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.precision import compute_dtype, precision_name

log = logging.getLogger(__name__)

SCHEDULERS = ("inverse_sqrt", "cosine", "constant")
_SEED_MIX = 1_000_003  # a prime that spreads (seed, rank, batch) over the 63-bit seed space


def step_seed(seed: int, rank: int, batch: int) -> int:
    """The RNG seed of training micro-batch `batch` (counted over the whole run) on `rank`.

    Dropout masks then depend only on (seed, rank, batch): a resumed run draws exactly the
    masks an uninterrupted run would, and DDP ranks draw different masks.
    """
    return ((int(seed) * _SEED_MIX + int(rank)) * _SEED_MIX + int(batch)) % (2**63 - 1)


def total_norm(tensors: list[Tensor]) -> Tensor:
    """The 2-norm of all `tensors` together (0-d); fused where torch has `get_total_norm`."""
    fused = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if fused is not None:
        return fused([t.detach() for t in tensors])
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t.detach()) for t in tensors])
    )


def clip_gradients(
    root: nn.Module,
    parameters: Iterable[nn.Parameter],
    max_value: float | None,
    algorithm: str | None = "norm",
) -> Tensor:
    """Clip the gradients as Lightning's `gradient_clip_val`/`_algorithm` ask and return the
    global 2-norm of the gradients before clipping (0-d, on their device; never read here).

    Lightning's own clipping (`Precision.clip_grad_by_norm` in
    lightning/pytorch/plugins/precision/precision.py) calls `torch.nn.utils.clip_grad_norm_`
    and drops the norm it returns; this keeps it. Under FSDP the norm must cover every rank's
    shard, which only the root module's `FullyShardedDataParallel.clip_grad_norm_` computes
    (Lightning's `FSDPPrecision.clip_grad_by_norm` refuses to clip by norm for that reason).

    Args:
        root: the module the strategy trains (`trainer.model`): FSDP's root, DDP's wrapper or
            the LightningModule itself.
        parameters: the parameters the optimiser updates.
        max_value: the clipping threshold; None or <= 0 = no clipping (the norm is still
            computed).
        algorithm: "norm" (clip the global norm, the default) or "value" (clip each element).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    params = [p for p in parameters if p.grad is not None]
    fsdp = isinstance(root, FullyShardedDataParallel)
    clip = max_value is not None and max_value > 0
    if clip and str(algorithm) != "value":
        if fsdp:
            return root.clip_grad_norm_(max_value)  # type: ignore[arg-type]
        return torch.nn.utils.clip_grad_norm_(params, max_value)  # type: ignore[arg-type]
    if fsdp:  # the only sharding-aware norm; max_norm=inf scales the gradients by 1
        norm = root.clip_grad_norm_(math.inf)
    else:
        norm = total_norm([p.grad for p in params]) if params else torch.zeros(())  # type: ignore[misc]
    if clip:
        torch.nn.utils.clip_grad_value_(params, max_value)  # type: ignore[arg-type]
    return norm


def _plain(value: Any) -> Any:
    """A Hydra/OmegaConf container as plain dicts and lists (other values unchanged)."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[Tensor, Tensor, Tensor]:
    """Label-smoothed cross-entropy from one log-softmax (fairseq's formulation).

    Args:
        logits: (N, V) unnormalised scores.
        target: (N,) gold ids; `ignore_index` positions contribute nothing.
        epsilon: smoothing mass spread uniformly over the vocabulary.

    Returns:
        (loss_sum, nll_sum, ntokens): summed smoothed loss, summed NLL, and the number of
        non-ignored targets (all 0-d tensors).
    """
    # at least fp32 (bf16/fp16 logits are upcast; fp64 stays fp64)
    lprobs = F.log_softmax(
        logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1
    )  # (N, V)
    keep = target.ne(ignore_index)  # (N,)
    nll = -lprobs.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (N,)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    if epsilon > 0:
        smooth = -lprobs.sum(-1).masked_fill(~keep, 0.0).sum()  # Σ over V of -log p
        loss_sum = (1.0 - epsilon) * nll_sum + epsilon / lprobs.size(-1) * smooth
    else:
        loss_sum = nll_sum
    return loss_sum, nll_sum, keep.sum()


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


class TranslationModule(L.LightningModule):
    """Trains a `Seq2SeqTransformer` with label-smoothed, token-normalised cross-entropy.

    Args:
        model_config: a `TransformerConfig` or its dict (vocab sizes filled in from the tokenizer).
        tokenizer: the sentencepiece `Tokenizer` (stored inside every checkpoint; the scoring
            callback decodes with it).
        src_lang, tgt_lang: language codes (stored inside every checkpoint).
        optimizer: a partial optimizer factory taking the parameters (Hydra `_partial_: true`).
        scheduler: {"name": inverse_sqrt|cosine|constant, "warmup_steps": int, "min_lr_ratio": float}.
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
        scheduler: dict[str, Any] | None = None,
        label_smoothing: float = 0.1,
        compile: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model_config, TransformerConfig):
            model_config = TransformerConfig.from_dict(_plain(model_config))
        self.model = Seq2SeqTransformer(model_config)
        self.tokenizer, self.src_lang, self.tgt_lang = tokenizer, src_lang, tgt_lang
        self.optimizer_factory = optimizer
        self.scheduler_cfg = _plain(scheduler or {"name": "inverse_sqrt", "warmup_steps": 4000})
        self.label_smoothing = float(label_smoothing)
        self.compile = compile
        self.seed = seed
        self._tick: float | None = None
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
    def forward(self, src: Tensor, config: DecodeConfig | None = None) -> list[list[int]]:
        """Decode with `litmt.decoding.decode`: the best hypothesis' target ids per source row.

        Callbacks call it through `trainer.model`, so that a DDP or FSDP wrapper runs it as a
        forward pass (FSDP gathers its sharded root weights only inside one).

        Args:
            src: (B, S) source ids, right-padded.
            config: decoding settings (None = `DecodeConfig`'s defaults).

        Returns:
            B lists of target ids without bos/eos.
        """
        return [hyps[0].tokens if hyps else [] for hyps in decode(self.model, src, config)]

    # -- training ---------------------------------------------------------------------------
    def _loss(
        self, batch: dict[str, Tensor], forward: Callable[[Tensor, Tensor], Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        logits = forward(batch["src"], batch["tgt_in"])  # (B, T, V)
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
        loss_sum, nll_sum, ntok = self._loss(batch, self.model)
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
        now = time.perf_counter()
        if self._tick is not None and "ntokens" in batch:  # a python int: no device sync
            rate = int(batch["ntokens"]) / max(now - self._tick, 1e-9)
            self.log("train/tok_per_s", rate, prog_bar=True, batch_size=bs)
        self._tick = now
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
        """Raise `LitmtError` if the gradient norm is not finite (fairseq's check).

        Args:
            norm: the global gradient norm of this optimiser step (0-d); the only value read
                on the host in a normal step.
            loss: this rank's summed training loss of the step (0-d), read only when `norm`
                is not finite, to say whether the loss itself was.
        """
        if bool(torch.isfinite(norm)):  # one device->host read per optimiser step
            return
        hint = "the last saved checkpoint is intact"
        if loss is not None and not bool(torch.isfinite(loss)):
            raise LitmtError(
                f"the training loss became {float(loss)} at step {self.global_step}; stopped "
                f"before updating the weights, {hint}: lower module.optimizer.lr, raise warmup, "
                "use bf16-mixed instead of 16-mixed, or keep trainer.gradient_clip_val on"
            )
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return  # fp16 loss scaling: the scaler skips this step and lowers its scale
        raise LitmtError(
            f"the gradients became non-finite (norm {float(norm)}) at step {self.global_step}; "
            f"stopped before updating the weights, {hint}: lower module.optimizer.lr or raise "
            "module.scheduler.warmup_steps"
        )

    def on_train_epoch_start(self) -> None:
        self._tick = None

    def _time_budget(self) -> Timer | None:
        """Lightning's `Timer` when the run is bounded by `trainer.max_time` only (no max_steps)."""
        if self.trainer.max_steps > 0:
            return None
        for callback in self.trainer.callbacks:
            if isinstance(callback, Timer) and callback.time_remaining() is not None:
                return callback
        return None

    def configure_optimizers(self) -> dict[str, Any]:
        factory = self.optimizer_factory or (
            lambda params: torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-9)
        )
        optimizer = factory(self.model.parameters())
        sc = self.scheduler_cfg
        total = sc.get("total_steps")
        time_progress = None
        if sc.get("name", "inverse_sqrt") == "cosine" and not total:
            timer = self._time_budget()
            if timer is not None:
                budget = float(timer.time_elapsed()) + float(timer.time_remaining())
                log.info(
                    "cosine LR decay follows the time budget trainer.max_time (%.0f s): the LR "
                    "reaches min_lr_ratio when the run stops",
                    budget,
                )

                def time_progress() -> float:
                    return float(timer.time_elapsed()) / budget

            else:
                total = int(self.trainer.estimated_stepping_batches)
        fn = lr_lambda(
            sc.get("name", "inverse_sqrt"),
            sc.get("warmup_steps", 4000),
            total,
            sc.get("min_lr_ratio", 0.0),
            time_progress,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"},
        }

    # -- validation / test (loss only; decoding and BLEU are `litmt.callbacks`) -------------
    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        loss_sum, nll_sum, ntok = self._loss(batch, self.model)
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
            self.model.config, self.tokenizer, self.src_lang, self.tgt_lang
        )
        # the training precision, so that inference can pick the same compute dtype
        checkpoint[META_KEY]["precision"] = precision_name(self.trainer.precision_plugin)
