"""`math`: the reference kernel, softmax attention written out in plain PyTorch ops.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.
"""

from __future__ import annotations

from torch import Tensor

from litmt.attention.base import ALL_DTYPES, AttentionKernel, BackendSupport


class MathAttention(AttentionKernel):
    """softmax(Q Kᵀ / √D + mask) V, written out. Slow and memory-hungry, but transparent.

    The computation is `AttentionKernel.forward_with_weights`, the contract's reference,
    which also returns the weights (B, H, Tq, Tk) for heatmaps.
    """

    name = "math"
    support = BackendSupport(
        weights=True, dtypes=ALL_DTYPES, notes="reference; returns weights for heatmaps"
    )

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
