"""`flash`: the flash-attn package (FlashAttention-2), CUDA sm80+, fp16/bf16.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, N non-padding tokens.

- no padding mask: ``flash_attn_func`` on (B, T, H, D), which is already our layout.
  flash-attn >= 2.1 aligns a causal mask with Tq != Tk to the bottom right, i.e. query i
  sees keys j <= i + Tk - Tq, exactly the contract's rule.
- padding mask: the padding keys are dropped and the rest packed into one (N, H, D) tensor
  with cumulative lengths ``cu_seqlens`` for ``flash_attn_varlen_func``. Non-causal: every
  query row is kept. Causal (self-attention): queries are packed with the same mask, so
  query i still sees exactly the non-padding keys j <= i; padded query rows return 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import (
    AttentionKernel,
    BackendSupport,
    causal_mask,
    safe_padding_mask,
)
from litmt.errors import BackendError

HALF_DTYPES = (torch.float16, torch.bfloat16)


def unpad(x: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """Pack the kept positions of `x` (B, T, H, D) by `keep` (B, T) bool.

    Returns:
        packed (N, H, D), flat indices (N,) into B*T, cu_seqlens (B+1,) int32, max length.
    """
    b, t, h, d = x.shape
    lengths = keep.sum(dim=1, dtype=torch.int32)  # (B,)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # (B+1,)
    index = keep.flatten().nonzero(as_tuple=True)[0]  # (N,)
    packed = x.reshape(b * t, h, d).index_select(0, index)  # (N, H, D)
    return packed, index, cu_seqlens, int(lengths.max())


class FlashAttention(AttentionKernel):
    """FlashAttention-2 kernels; padding via the variable-length (packed) API."""

    name = "flash"
    support = BackendSupport(
        devices=("cuda",),
        dtypes=HALF_DTYPES,
        packages=("flash_attn",),
        extra="flash",
        min_cuda_capability=(8, 0),
        notes="flash-attn 2; CUDA sm80+, fp16/bf16; varlen path for padding",
    )

    def __init__(self) -> None:
        super().__init__()  # imports flash_attn or raises BackendError with the extra to install
        from flash_attn import flash_attn_func, flash_attn_varlen_func

        self._func, self._varlen = flash_attn_func, flash_attn_varlen_func

    def check_inputs(self, q: Tensor) -> None:
        """Refuse inputs the kernel cannot take (not CUDA, not fp16/bf16) with a clear error."""
        if q.device.type != "cuda" or q.dtype not in HALF_DTYPES:
            raise BackendError(
                f"attention backend 'flash' needs CUDA fp16/bf16 inputs, got {q.dtype} on "
                f"{q.device.type}; use attention=sdpa there"
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
        self.check_inputs(q)
        b, tq, h, d = q.shape
        tk = k.size(1)
        kpm = safe_padding_mask(key_padding_mask)
        if kpm is None:
            return self._func(q, k, v, dropout_p=dropout_p, causal=causal)  # (B, Tq, H, D)
        keep = ~kpm  # (B, Tk)
        k_p, index, cu_k, max_k = unpad(k, keep)  # (N, H, D)
        v_p = v.reshape(b * tk, h, d).index_select(0, index)
        if not causal:
            q_p = q.reshape(b * tq, h, d)  # every query row, (B*Tq, H, D)
            cu_q = torch.arange(0, (b + 1) * tq, tq, dtype=torch.int32, device=q.device)
            out = self._varlen(q_p, k_p, v_p, cu_q, cu_k, tq, max_k, dropout_p=dropout_p)
            return out.view(b, tq, h, d)
        if tq != tk:  # causal + padding against a cache: rare; keep it exact via sdpa
            mask = keep[:, None, None, :] & causal_mask(tq, tk, q.device)  # (B, 1, Tq, Tk)
            out = F.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, dropout_p=dropout_p
            )  # (B, H, Tq, D)
            return out.transpose(1, 2)
        q_p = q.reshape(b * tq, h, d).index_select(0, index)  # queries packed like the keys
        out_p = self._varlen(
            q_p, k_p, v_p, cu_k, cu_k, max_k, max_k, dropout_p=dropout_p, causal=True
        )  # (N, H, D)
        out = out_p.new_zeros(b * tq, h, d).index_copy(0, index, out_p)  # padded rows: 0
        return out.view(b, tq, h, d)
