"""Mask and packing helpers shared by the kernels.

Letters used in shapes: B batch, Tq query length, Tk key length, H heads, D head dim,
N kept (non-padding) positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def safe_padding_mask(key_padding_mask: Tensor | None) -> Tensor | None:
    """Un-mask rows whose keys are *all* padding, so softmax never sees an empty row.

    Args:
        key_padding_mask: (B, Tk) bool, True = padding, or None.

    Returns:
        (B, Tk) bool with fully padded rows set to False (their output is then finite
        garbage at positions that are padding anyway), or None.
    """
    if key_padding_mask is None:
        return None
    return key_padding_mask & ~key_padding_mask.all(dim=-1, keepdim=True)


def causal_mask(tq: int, tk: int, device: torch.device) -> Tensor:
    """(Tq, Tk) bool, True where query i may see key j (j <= i + Tk - Tq)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=tk - tq)


def pattern_without_padding(pattern: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """A positional pattern minus the padded keys, for `allowed_keys` of local / sparse.

    Args:
        pattern: (Tq, Tk) bool, True where the pattern lets query i see key j.
        key_padding_mask: (B, Tk) bool, True = padding, or None.

    Returns:
        (B or 1, 1, Tq, Tk) bool; a row whose pattern holds only padding keeps its pattern
        (a padded query: finite, unused values).
    """
    allowed = pattern[None, None]  # (1, 1, Tq, Tk)
    kpm = safe_padding_mask(key_padding_mask)
    if kpm is None:
        return allowed
    real = allowed & ~kpm[:, None, None, :]  # (B, 1, Tq, Tk)
    return torch.where(real.any(dim=-1, keepdim=True), real, allowed)


def unpad(x: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """Pack the kept positions of `x` (B, T, H, D) by `keep` (B, T) bool, in row order.

    The layout of flash-attn's varlen functions and of xFormers' block-diagonal biases.

    Returns:
        packed (N, H, D), flat indices (N,) into B*T, cu_seqlens (B+1,) int32, max length.
    """
    b, t, h, d = x.shape
    lengths = keep.sum(dim=1, dtype=torch.int32)  # (B,)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # (B+1,)
    index = keep.flatten().nonzero(as_tuple=True)[0]  # (N,)
    packed = x.reshape(b * t, h, d).index_select(0, index)  # (N, H, D)
    return packed, index, cu_seqlens, int(lengths.max())


def pad_rows(packed: Tensor, index: Tensor, b: int, t: int) -> Tensor:
    """Inverse of `unpad`: (N, H, D) rows back to (B, T, H, D), zeros where nothing was kept."""
    out = packed.new_zeros(b * t, *packed.shape[1:]).index_copy(0, index, packed)  # (B*T, H, D)
    return out.view(b, t, *packed.shape[1:])


def causal_padded_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """Causal + key padding with Tq != Tk (a chunk of queries against a KV cache), via sdpa.

    Fused libraries align a padded causal mask to each row's *real* lengths; the contract
    aligns it to the padded ones (query i sees j <= i + Tk - Tq). This rare case stays exact.

    Args:
        q: (B, Tq, H, D); k, v: (B, Tk, H, D); keep: (B, Tk) bool, True = real key.

    Returns:
        (B, Tq, H, D)
    """
    mask = keep[:, None, None, :] & causal_mask(q.size(1), k.size(1), q.device)  # (B, 1, Tq, Tk)
    out = F.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, dropout_p=dropout_p
    )  # (B, H, Tq, D)
    return out.transpose(1, 2)
