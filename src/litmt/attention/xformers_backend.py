"""`xformers`: ``xformers.ops.memory_efficient_attention`` with structured attention biases.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, N non-padding tokens.
(The file is not called ``xformers.py`` so that it never shadows the package.)

The masks are xformers bias objects, never dense (Tq, Tk) tensors
(xformers ``xformers/ops/fmha/attn_bias.py``):

- causal, no padding: ``LowerTriangularMask`` (Tq == Tk) or
  ``LowerTriangularFromBottomRightMask`` (Tq != Tk: query i sees j <= i + Tk - Tq).
- padding: the batch is packed into one sequence of blocks and a ``BlockDiagonalMask``
  built from the per-row lengths keeps each query inside its own row's keys.
- causal + padding (self-attention): queries are packed with the same mask as the keys and
  ``BlockDiagonalCausalMask`` applies; padded query rows return 0.
- causal + padding with Tq != Tk (rare): exact through sdpa.

Block-diagonal biases hold their sequence starts as a tensor. ``from_seqlens`` puts it on
the *current* CUDA device unless told otherwise (``_get_default_bias_device``), and
``memory_efficient_attention`` refuses a bias on another device than the queries
(``xformers/ops/fmha/common.py``, ``Inputs.validate_inputs``), so the biases are built with
``device=q.device`` (e.g. ``translate device=cuda:1``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from litmt.attention.base import (
    AttentionKernel,
    BackendSupport,
    causal_padded_attention,
    pad_rows,
    safe_padding_mask,
    unpad,
)


class XFormersAttention(AttentionKernel):
    """xFormers memory-efficient attention (CUTLASS / flash / CK kernels, chosen by xformers)."""

    name = "xformers"
    support = BackendSupport(
        devices=("cuda",),
        packages=("xformers",),
        extra="xformers",
        notes="xformers memory_efficient_attention; BlockDiagonal biases for padding",
    )

    def __init__(self) -> None:
        super().__init__()  # imports xformers or raises BackendError with the extra
        import xformers.ops as xops
        from xformers.ops.fmha import attn_bias

        self._attend, self._bias = xops.memory_efficient_attention, attn_bias

    def _block_diagonal(
        self, cls_name: str, q_lens: list[int], k_lens: list[int], device: torch.device
    ) -> object:
        cls = getattr(self._bias, cls_name)
        return cls.from_seqlens(q_seqlen=q_lens, kv_seqlen=k_lens, device=device)

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
        self.check_inputs(q)
        b, tq, h, d = q.shape
        tk = k.size(1)
        kpm = safe_padding_mask(key_padding_mask)
        if kpm is None:
            bias = None
            if causal:
                bias = (
                    self._bias.LowerTriangularMask()
                    if tq == tk
                    else self._bias.LowerTriangularFromBottomRightMask()
                )
            return self._attend(q, k, v, attn_bias=bias, p=dropout_p)  # (B, Tq, H, D)
        keep = ~kpm  # (B, Tk)
        if causal and tq != tk:
            return causal_padded_attention(q, k, v, keep, dropout_p)
        k_p, index, _, _ = unpad(k, keep)  # (N, H, D)
        v_p = v.reshape(b * tk, h, d).index_select(0, index)  # (N, H, D)
        k_lens = keep.sum(dim=1).tolist()  # from_seqlens takes Python ints
        if not causal:
            bias = self._block_diagonal("BlockDiagonalMask", [tq] * b, k_lens, q.device)
            out = self._attend(
                q.reshape(1, b * tq, h, d), k_p[None], v_p[None], attn_bias=bias, p=dropout_p
            )  # (1, B*Tq, H, D)
            return out.view(b, tq, h, d)
        q_p = q.reshape(b * tq, h, d).index_select(0, index)  # queries packed like the keys
        bias = self._block_diagonal("BlockDiagonalCausalMask", k_lens, k_lens, q.device)
        out_p = self._attend(q_p[None], k_p[None], v_p[None], attn_bias=bias, p=dropout_p)
        return pad_rows(out_p[0], index, b, tq)  # (B, Tq, H, D), padded rows 0
