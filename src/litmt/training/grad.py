"""Gradient norms and clipping, FSDP-aware.

Non-finite values (fairseq's check): `configure_gradient_clipping` gets the global gradient
norm from the clipping itself (`clip_grad_norm_` returns it; with clipping off the norm is
computed alone) and reads it once per optimiser step. It needs no all-reduce of its own: DDP
gradients are equal on every rank, and FSDP's `clip_grad_norm_` reduces the shard norms, so all
ranks see the same norm and stop together. A non-finite norm raises `LitmtError` before the
optimiser updates the weights, except under "16-mixed", whose scaler skips such steps itself
(a non-finite loss raises there too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from litmt.errors import LitmtError


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


def check_finite(norm: Tensor, loss: Tensor | None, step: int, *, scaled: bool = False) -> None:
    """Raise `LitmtError` if the gradient norm is not finite (fairseq's check).

    Args:
        norm: the global gradient norm of this optimiser step (0-d); the only value read
            on the host in a normal step.
        loss: this rank's summed training loss of the step (0-d), read only when `norm`
            is not finite, to say whether the loss itself was.
        step: the optimiser step, for the message.
        scaled: fp16 loss scaling is on: its scaler skips a non-finite step itself, so only
            a non-finite loss stops the run.
    """
    if bool(torch.isfinite(norm)):  # one device->host read per optimiser step
        return
    hint = "the last saved checkpoint is intact"
    if loss is not None and not bool(torch.isfinite(loss)):
        raise LitmtError(
            f"the training loss became {float(loss)} at step {step}; stopped "
            f"before updating the weights, {hint}: lower module.optimizer.lr, raise warmup, "
            "use bf16-mixed instead of 16-mixed, or keep trainer.gradient_clip_val on"
        )
    if scaled:
        return  # fp16 loss scaling: the scaler skips this step and lowers its scale
    raise LitmtError(
        f"the gradients became non-finite (norm {float(norm)}) at step {step}; "
        f"stopped before updating the weights, {hint}: lower module.optimizer.lr or raise "
        "module.scheduler.warmup_steps"
    )
