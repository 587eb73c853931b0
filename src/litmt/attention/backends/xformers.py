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

from litmt.attention.base import BackendSupport, PackedKernel


class XFormersAttention(PackedKernel):
    """xFormers memory-efficient attention (CUTLASS / flash / CK kernels, chosen by xformers)."""

    name = "xformers"
    support = BackendSupport(
        devices=("cuda",),
        packages=("xformers",),
        requires=("xformers.ops:memory_efficient_attention", "xformers.ops.fmha:attn_bias"),
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

    def dense(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> Tensor:
        """(B, T, H, D) as they are, causal through a lower-triangular bias; (B, Tq, H, D)."""
        bias = None
        if causal:
            bias = (
                self._bias.LowerTriangularMask()
                if q.size(1) == k.size(1)
                else self._bias.LowerTriangularFromBottomRightMask()
            )
        return self._attend(q, k, v, attn_bias=bias, p=dropout_p)

    def packed_keys(
        self, q: Tensor, k: Tensor, v: Tensor, cu_k: Tensor, max_k: int, dropout_p: float
    ) -> Tensor:
        """The batch as one sequence of blocks; a ``BlockDiagonalMask`` keeps rows apart."""
        b, tq, h, d = q.shape
        k_lens = cu_k.diff().tolist()  # from_seqlens takes Python ints
        bias = self._block_diagonal("BlockDiagonalMask", [tq] * b, k_lens, q.device)
        out = self._attend(
            q.reshape(1, b * tq, h, d), k[None], v[None], attn_bias=bias, p=dropout_p
        )
        return out.view(b, tq, h, d)  # from (1, B*Tq, H, D)

    def packed_causal(
        self, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, dropout_p: float
    ) -> Tensor:
        """(1, N, H, D) under a ``BlockDiagonalCausalMask``; returns (N, H, D)."""
        lens = cu.diff().tolist()
        bias = self._block_diagonal("BlockDiagonalCausalMask", lens, lens, q.device)
        return self._attend(q[None], k[None], v[None], attn_bias=bias, p=dropout_p)[0]
