"""`flash`: the flash-attn package (FlashAttention-2), CUDA sm80+, fp16/bf16.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, N non-padding tokens.

- no padding mask: ``flash_attn_func`` on (B, T, H, D), which is already our layout.
  flash-attn >= 2.1 aligns a causal mask with Tq != Tk to the bottom right, i.e. query i
  sees keys j <= i + Tk - Tq, exactly the contract's rule (flash-attn
  ``flash_attn/flash_attn_interface.py``, ``flash_attn_func`` docstring).
- padding mask: the padding keys are dropped and the rest packed into one (N, H, D) tensor
  with cumulative lengths ``cu_seqlens`` for ``flash_attn_varlen_func``. Non-causal: every
  query row is kept. Causal (self-attention): queries are packed with the same mask, so
  query i still sees exactly the non-padding keys j <= i; padded query rows return 0.
- causal + padding with Tq != Tk (a chunk against a padded cache): flash-attn would align
  the diagonal to each row's real lengths; this rare case runs exactly through sdpa.
"""

from __future__ import annotations

import torch
from torch import Tensor

from litmt.attention.base import HALF_DTYPES, BackendSupport, PackedKernel


class FlashAttention(PackedKernel):
    """FlashAttention-2 kernels; padding via the variable-length (packed) API."""

    name = "flash"
    support = BackendSupport(
        devices=("cuda",),
        dtypes=HALF_DTYPES,
        packages=("flash_attn",),
        requires=("flash_attn:flash_attn_func", "flash_attn:flash_attn_varlen_func"),
        extra="flash",
        min_cuda_capability=(8, 0),
        notes="flash-attn 2; CUDA sm80+, fp16/bf16; varlen path for padding",
    )

    def __init__(self) -> None:
        super().__init__()  # imports flash_attn and checks its functions, or raises BackendError
        from flash_attn import flash_attn_func, flash_attn_varlen_func

        self._func, self._varlen = flash_attn_func, flash_attn_varlen_func

    def dense(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> Tensor:
        """``flash_attn_func`` on (B, T, H, D), our layout; returns (B, Tq, H, D)."""
        return self._func(q, k, v, dropout_p=dropout_p, causal=causal)

    def packed_keys(
        self, q: Tensor, k: Tensor, v: Tensor, cu_k: Tensor, max_k: int, dropout_p: float
    ) -> Tensor:
        """Every query row, (B*Tq, H, D) with uniform cu_seqlens, against the packed keys."""
        b, tq, h, d = q.shape
        q_p = q.reshape(b * tq, h, d)  # (B*Tq, H, D)
        cu_q = torch.arange(0, (b + 1) * tq, tq, dtype=torch.int32, device=q.device)  # (B+1,)
        out = self._varlen(q_p, k, v, cu_q, cu_k, tq, max_k, dropout_p=dropout_p)
        return out.view(b, tq, h, d)

    def packed_causal(
        self, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, dropout_p: float
    ) -> Tensor:
        """``flash_attn_varlen_func`` with causal=True on (N, H, D); returns (N, H, D)."""
        return self._varlen(q, k, v, cu, cu, max_len, max_len, dropout_p=dropout_p, causal=True)
