"""`math`: the reference kernel, plain PyTorch ops; the only one that returns weights.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.
"""

from __future__ import annotations

import math as _math

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import (
    ALL_DTYPES,
    AttentionKernel,
    BackendSupport,
    causal_mask,
    safe_padding_mask,
)


class MathAttention(AttentionKernel):
    """softmax(Q Kᵀ / √D + mask) V, written out. Slow and memory-hungry, but transparent."""

    name = "math"
    support = BackendSupport(
        weights=True, dtypes=ALL_DTYPES, notes="reference; returns weights for heatmaps"
    )

    def forward_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, Tensor]:
        """Like `forward`, but also return the weights (B, H, Tq, Tk) (before dropout)."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        scores = torch.matmul(q, k.transpose(-2, -1)) / _math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
        allowed = None
        kpm = safe_padding_mask(key_padding_mask)
        if kpm is not None:
            allowed = ~kpm[:, None, None, :]  # (B, 1, 1, Tk)
        if causal:
            cm = causal_mask(q.size(-2), k.size(-2), q.device)  # (Tq, Tk)
            allowed = cm if allowed is None else allowed & cm
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(attn, v)  # (B, H, Tq, D)
        return out.transpose(1, 2), weights  # (B, Tq, H, D), (B, H, Tq, Tk)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D); return (B, Tq, H, D)."""
        out, _ = self.forward_with_weights(
            q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p
        )
        return out
