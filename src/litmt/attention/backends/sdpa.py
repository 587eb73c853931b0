"""`sdpa`: torch.nn.functional.scaled_dot_product_attention; torch picks its fastest kernel.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.
"""

from __future__ import annotations

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
