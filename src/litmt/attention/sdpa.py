"""`sdpa`: torch.nn.functional.scaled_dot_product_attention; torch picks its fastest kernel.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.

One exception, measured on CPU: a short block of queries (Tq <= 16) over head-major
contiguous keys/values without autograd — the cross-attention of an incremental decode step,
whose K/V `MultiHeadAttention` stores head-major — runs as two batched matmuls. PyTorch's CPU
flash kernel costs 2.5-3x more there (B=32 sentences x 5 beams, H=4-8, Tk=22; see
docs/benchmarks.md). The result is the same softmax(q k^T / sqrt(D)) v in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import AttentionKernel, BackendSupport, causal_mask, safe_padding_mask


class SDPAAttention(AttentionKernel):
    """PyTorch's fused attention (flash / memory-efficient / math, chosen by torch)."""

    name = "sdpa"
    support = BackendSupport(notes="torch fused kernels; the default")

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
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        kpm = safe_padding_mask(key_padding_mask)
        if _short_query_block(q, k, v, causal, dropout_p):
            return _matmul_attention(q, k, v, kpm).transpose(1, 2)  # (B, Tq, H, D)
        mask = None
        if kpm is not None:
            mask = ~kpm[:, None, None, :]  # (B, 1, 1, Tk), True = attend
            if causal:
                mask = mask & causal_mask(q.size(-2), k.size(-2), q.device)
                causal = False
        elif causal and q.size(-2) != k.size(-2):
            mask, causal = causal_mask(q.size(-2), k.size(-2), q.device), False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )  # (B, H, Tq, D)
        return out.transpose(1, 2)  # (B, Tq, H, D)


SHORT_QUERY_BLOCK = 16  # longest query block served by `_matmul_attention`


def _short_query_block(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> bool:
    """Decode-time cross-attention on CPU: few queries, head-major K/V, no autograd."""
    if torch.compiler.is_compiling() or causal or dropout_p != 0.0:
        return False  # (compiled graphs: no guards on shapes)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return False
    return (
        q.device.type == "cpu"
        and q.size(-2) <= SHORT_QUERY_BLOCK
        and k.is_contiguous()
        and v.is_contiguous()
    )


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, kpm: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D)) v for q (B, H, Tq, D), k/v (B, H, Tk, D) -> (B, H, Tq, D).

    kpm: (B, Tk) bool, True = padding, with no fully padded row (`safe_padding_mask`).
    """
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-1, -2))  # (B, H, Tq, Tk)
    if kpm is not None:
        scores.masked_fill_(kpm[:, None, None, :], float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v)  # (B, H, Tq, D)
