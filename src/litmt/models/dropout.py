"""`Dropout`: `nn.Dropout` with a cheaper random mask on CPU.

Shapes: any; the mask has the input's shape.

PyTorch's CPU dropout draws one Bernoulli sample per element (`bernoulli_`), which took about
7 % of a training step of the small model on a 2-core CPU (docs/benchmarks.md). Here each
64-bit random integer from torch's generator gives four 16-bit uniforms, and an element is
kept when its uniform is at least round(p * 2^16): the drop probability is p rounded to a
multiple of 2^-16 (0.1 -> 0.100006), the kept values are scaled by 1 / (1 - p) as usual. The
mask costs about a fifth of `bernoulli_`, and it comes from torch's seeded generator, so
`torch.manual_seed` makes it reproducible. Other devices (CUDA's dropout is a fused kernel)
and `torch.compile` graphs use `F.dropout`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """Bool mask of `shape`, each element False (dropped) with probability ~p (2^-16 steps)."""
    n = 1
    for s in shape:
        n *= s
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    uniforms = words.view(torch.int16)[:n].view(shape)  # 4 x 16 random bits per draw
    threshold = round(p * _LEVELS) - _LEVELS // 2  # int16 runs from -2^15
    return uniforms >= threshold


class _MaskedScale(torch.autograd.Function):
    """out = x * mask * scale, and the same for the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        """x (any), mask (same shape, bool) -> x where kept, scaled; 0 where dropped."""
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x.mul(mask).mul_(scale)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        """grad (same shape) -> grad of x."""
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Drop elements of `x` with probability p when training (CPU: `keep_mask`)."""
    if torch.compiler.is_compiling() or x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, training=training)
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    return _MaskedScale.apply(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, no parameters) using `dropout` above."""

    def forward(self, x: Tensor) -> Tensor:
        """(any) -> same shape."""
        return dropout(x, self.p, self.training)
