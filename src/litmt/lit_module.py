"""`TranslationModule`: the LightningModule that trains and scores a `Seq2SeqTransformer`.

Shapes: B batch, S source length, T target length, V target vocabulary, N = B*T.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import Tensor

from litmt.checkpoint import META_KEY, make_meta
from litmt.data.tokenizer import PAD_ID, Tokenizer
from litmt.errors import ConfigError, LitmtError
from litmt.precision import compute_dtype
from litmt.models import Seq2SeqTransformer, TransformerConfig

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


def all_ranks_true(flag: bool, device: torch.device) -> bool:
    """`flag` AND-ed over every process of the default group (no-op in one process).

    A check that raises on one rank only would leave the others waiting forever in the next
    collective; reducing the flag first makes every rank raise together.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([1 if flag else 0], device=device, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


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
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
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
    name: str, warmup_steps: int, total_steps: int | None, min_lr_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step `step` (0-based).

    - inverse_sqrt: linear warmup to 1, then sqrt(warmup / step) (Vaswani et al. 2017).
    - cosine: linear warmup, then cosine decay to `min_lr_ratio` at `total_steps`.
    - constant: linear warmup, then 1.
    """
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler '{name}'; valid names: {', '.join(SCHEDULERS)}")
    warmup = max(1, int(warmup_steps))

    def fn(step: int) -> float:
        s = step + 1
        if s < warmup:
            return s / warmup
        if name == "inverse_sqrt":
            return math.sqrt(warmup / s)
        if name == "cosine":
            total = max(warmup + 1, int(total_steps or 0))
            progress = min(1.0, (s - warmup) / (total - warmup))
            return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return fn


class TranslationModule(L.LightningModule):
    """Trains a `Seq2SeqTransformer` with label smoothing and scores it with sacreBLEU.

    Args:
        model_config: a `TransformerConfig` or its dict (vocab sizes filled in from the tokenizer).
        tokenizer: the sentencepiece `Tokenizer` (stored inside every checkpoint).
        src_lang, tgt_lang: language codes (stored inside every checkpoint).
        optimizer: a partial optimizer factory taking the parameters (Hydra `_partial_: true`).
        scheduler: {"name": inverse_sqrt|cosine|constant, "warmup_steps": int, "min_lr_ratio": float}.
        label_smoothing: epsilon of the smoothed loss.
        val_decode: {"beam_size": 1 (greedy) or k, "max_len_a", "max_len_b", "length_penalty"}.
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
        val_decode: dict[str, Any] | None = None,
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
        self.val_decode = {"beam_size": 1, "max_len_a": 1.2, "max_len_b": 10, "length_penalty": 1.0}
        self.val_decode.update(_plain(val_decode or {}))
        self.compile = compile
        self.seed = seed
        self._hyps: dict[str, list[tuple[int, str]]] = {}
        self._tick: float | None = None
        self._logged_signature = False
        self.references: dict[str, list[str]] = {}
        self.sources: dict[str, list[str]] = {}

    # -- setup ----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Validate attention backends for the device/precision now, and grab references."""
        dtype = compute_dtype(self.trainer.precision_plugin)
        self.model.validate_backends(
            self.trainer.strategy.root_device, dtype, training=stage == "fit"
        )
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None:
            for split in ("valid", "test"):
                try:
                    self.references[split] = dm.references(split)
                    self.sources[split] = dm.sources(split)
                except Exception:
                    continue
        if self.compile and stage == "fit" and not getattr(self, "_compiled", False):
            self.model.compile(dynamic=True)  # in place: no `_orig_mod.` prefix in checkpoints
            self._compiled = True

    # -- training ---------------------------------------------------------------------------
    def _loss(self, batch: dict[str, Tensor], forward: Callable[[Tensor, Tensor], Tensor]):
        logits = forward(batch["src"], batch["tgt_in"])  # (B, T, V)
        return label_smoothed_nll(
            logits.flatten(0, 1), batch["tgt_out"].flatten(), self.label_smoothing
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Re-seed the RNG (dropout) from (seed, rank, micro-batch number over the run)."""
        if self.seed is not None:
            total = self.trainer.fit_loop.epoch_loop.total_batch_idx  # restored on resume
            torch.manual_seed(step_seed(self.seed, self.global_rank, total))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss_sum, nll_sum, ntok = self._loss(batch, self.model)
        ntok_f = ntok.clamp_min(1).float()
        loss = loss_sum / ntok_f
        finite = bool(torch.isfinite(loss.detach()))
        if not all_ranks_true(finite, loss.device):
            value = "non-finite on another rank" if finite else str(loss.item())
            raise LitmtError(
                f"the training loss became {value} at step {self.global_step}; stopped before updating the weights, the last saved checkpoint is "
                "intact: lower module.optimizer.lr, raise warmup, use bf16-mixed instead of "
                "16-mixed, or keep trainer.gradient_clip_val on"
            )
        n = int(batch["ntokens"]) if "ntokens" in batch else int(ntok)
        now = time.perf_counter()
        bs = batch["src"].size(0)
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/ppl", torch.exp((nll_sum / ntok_f).detach().clamp(max=50)), batch_size=bs)
        if self._tick is not None:
            self.log(
                "train/tok_per_s", n / max(now - self._tick, 1e-9), prog_bar=True, batch_size=bs
            )
        self._tick = now
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Stop on non-finite gradients before they reach the weights (and a checkpoint).

        Skipped under fp16 loss scaling (`16-mixed`), whose scaler skips such steps itself.
        Gradients are already averaged over DDP ranks here; under FSDP each rank holds a
        shard, so the verdict is AND-ed over ranks.
        """
        if str(self.trainer.precision).startswith("16"):
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return
        from torch.distributed.fsdp import FullyShardedDataParallel

        norm = total_norm(grads)
        finite = bool(torch.isfinite(norm))
        if isinstance(self.trainer.model, FullyShardedDataParallel):
            finite = all_ranks_true(finite, norm.device)  # shards differ; DDP grads are equal
        if not finite:
            raise LitmtError(
                f"the gradients became non-finite (norm {norm.item()}) at step {self.global_step}; "
                "stopped before updating the weights, the last saved checkpoint is intact: lower "
                "module.optimizer.lr or raise module.scheduler.warmup_steps"
            )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip as configured; under FSDP through the root module's `clip_grad_norm_`, which
        computes the norm over every rank's shard (Lightning's FSDP plugin refuses to clip)."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        root = self.trainer.model
        if (
            gradient_clip_val
            and isinstance(root, FullyShardedDataParallel)
            and gradient_clip_algorithm in (None, "norm")
        ):
            root.clip_grad_norm_(gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_train_epoch_start(self) -> None:
        self._tick = None

    def configure_optimizers(self) -> dict[str, Any]:
        factory = self.optimizer_factory or (
            lambda params: torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-9)
        )
        optimizer = factory(self.model.parameters())
        sc = self.scheduler_cfg
        total = sc.get("total_steps")
        if sc.get("name", "inverse_sqrt") == "cosine" and not total:
            total = int(self.trainer.estimated_stepping_batches)
        fn = lr_lambda(
            sc.get("name", "inverse_sqrt"),
            sc.get("warmup_steps", 4000),
            total,
            sc.get("min_lr_ratio", 0.0),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"},
        }

    # -- validation / test ------------------------------------------------------------------
    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        loss_sum, nll_sum, ntok = self._loss(batch, self.model)
        bs = batch["src"].size(0)
        ntok_f = ntok.clamp_min(1).float()
        self.log(f"{split}/loss", loss_sum / ntok_f, batch_size=int(ntok), sync_dist=True)
        self.log(f"{split}/nll", nll_sum / ntok_f, batch_size=int(ntok), sync_dist=True)
        if split in self.references:
            ids = self.decode_ids(batch["src"])
            hyps = self.tokenizer.decode_tgt(ids)
            index = batch["index"].tolist() if "index" in batch else list(range(bs))
            self._hyps.setdefault(split, []).extend(zip(index, hyps, strict=True))

    def decode_ids(self, src: Tensor) -> list[list[int]]:
        """Decode a source batch (B, S) with the validation settings; returns token ids."""
        from litmt import search

        d = self.val_decode
        if int(d.get("beam_size", 1)) <= 1:
            hyps = search.greedy_search(
                self.model, src, max_len_a=d["max_len_a"], max_len_b=d["max_len_b"]
            )
            return [h.tokens for h in hyps]
        nbest = search.beam_search(
            self.model,
            src,
            beam_size=int(d["beam_size"]),
            length_penalty=d.get("length_penalty", 1.0),
            max_len_a=d["max_len_a"],
            max_len_b=d["max_len_b"],
        )
        return [n[0].tokens for n in nbest]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "valid")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_start(self) -> None:
        self._hyps.pop("valid", None)

    def on_test_epoch_start(self) -> None:
        self._hyps.pop("test", None)

    def gather_hypotheses(self, split: str) -> list[str] | None:
        """All ranks' (index, hypothesis) pairs, de-duplicated and in corpus order."""
        pairs = self._hyps.pop(split, [])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[list[tuple[int, str]] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, pairs)
            pairs = [p for part in gathered for p in (part or [])]
        by_index = dict(pairs)  # duplicates padded in by a distributed sampler collapse here
        refs = self.references.get(split, [])
        if not refs or len(by_index) < len(refs):
            return None  # partial run (e.g. limit_val_batches): no corpus score
        return [by_index[i] for i in range(len(refs))]

    def _score(self, split: str) -> None:
        hyps = self.gather_hypotheses(split)
        if hyps is None or self.trainer.sanity_checking:
            return
        from litmt.metrics import corpus_scores

        scores = corpus_scores(hyps, self.references[split], metrics=("bleu", "chrf"))
        self.log(f"{split}/bleu", scores["bleu"].score, prog_bar=True, rank_zero_only=False)
        self.log(f"{split}/chrf", scores["chrf"].score, rank_zero_only=False)
        self.last_scores = {split: scores, "hypotheses": hyps}
        if not self._logged_signature and self.trainer.is_global_zero:
            self._logged_signature = True
            for lg in self.loggers:
                with contextlib.suppress(Exception):  # a logger that cannot take strings
                    lg.log_hyperparams(
                        {
                            "sacrebleu/bleu_signature": scores["bleu"].signature,
                            "sacrebleu/chrf_signature": scores["chrf"].signature,
                        }
                    )

    def on_validation_epoch_end(self) -> None:
        self._score("valid")
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            self._log_heatmap()

    def on_test_epoch_end(self) -> None:
        self._score("test")

    def _log_heatmap(self) -> None:
        """Log one cross-attention heatmap of a fixed validation sentence to W&B (if used)."""
        from lightning.pytorch.loggers import WandbLogger

        wandb_loggers = [lg for lg in self.loggers if isinstance(lg, WandbLogger)]
        sources = self.sources.get("valid")
        if not wandb_loggers or not sources:
            return
        import matplotlib.pyplot as plt

        from litmt.visualize import cross_attention_figure

        try:
            fig = cross_attention_figure(self.model, self.tokenizer, sources[0])
        except Exception as exc:
            log.warning("skipping the attention heatmap: %s", exc)
            return
        wandb_loggers[0].log_image("valid/cross_attention", images=[fig], step=self.global_step)
        plt.close(fig)

    # -- checkpoints ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Make the checkpoint self-contained: model config, tokenizer bytes, languages."""
        checkpoint[META_KEY] = make_meta(
            self.model.config, self.tokenizer, self.src_lang, self.tgt_lang
        )
