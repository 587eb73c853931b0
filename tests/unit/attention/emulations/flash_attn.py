"""flash-attn 2's Python interface on CPU, following flash-attn's own rules.

Shapes: B batch, Sq/Sk query/key length, H heads (Hk key heads), D head dim, total_q /
total_k packed tokens.

Sources (Dao-AILab/flash-attention):

- ``flash_attn/flash_attn_interface.py``: ``flash_attn_func`` and ``flash_attn_varlen_func``
  (signatures, layouts, and the docstring rule "If causal=True, the causal mask is aligned
  to the bottom right corner of the attention matrix" (since 2.1); "If the row of the mask
  is all zero, the output will be zero");
- ``csrc/flash_attn/flash_api.cpp``: ``mha_fwd`` and ``mha_varlen_fwd`` (the TORCH_CHECKs:
  dtype fp16/bf16, CUDA, same dtypes, contiguous last dim, int32 contiguous cu_seqlens of
  shape (B+1,), head_size % 8 == 0 and <= 256, Hk divides H, batch > 0; and
  ``if (max_seqlen_q == 1) is_causal = false``).

A sequence longer than ``max_seqlen`` is undefined in the CUDA kernel (its grid is sized by
max_seqlen); the emulation raises instead of guessing. Calls are recorded in `CALLS`.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import Tensor

from . import emulate_current_device

ALLOW_CPU_FP32 = {"on": False}  # set by `install`; see the package docstring
CALLS: list[dict] = []


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    """flash_api.cpp mha_fwd / mha_varlen_fwd input checks."""
    if not ALLOW_CPU_FP32["on"]:
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        if not (q.is_cuda and k.is_cuda and v.is_cuda):
            raise RuntimeError("q must be on CUDA")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key must have the same dtype")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise RuntimeError("Input tensor must have contiguous last dimension")
    head_size, num_heads, num_heads_k = q.shape[-1], q.shape[-2], k.shape[-2]
    if head_size > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    if head_size % 8 != 0:
        raise RuntimeError(
            "query, key, value, and out_ must have a head_size that is a multiple of 8"
        )
    if num_heads % num_heads_k != 0:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")


def _attend(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
    """One sequence: q (Sq, H, D), k/v (Sk, Hk, D) -> (Sq, H, D), bottom-right causal."""
    sq, sk = q.size(0), k.size(0)
    rep = q.size(1) // k.size(1)
    qh = q.double().transpose(0, 1)  # (H, Sq, D)
    kh = k.double().repeat_interleave(rep, dim=1).transpose(0, 1)  # (H, Sk, D)
    vh = v.double().repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # (H, Sq, Sk)
    if causal:  # bottom-right: query i sees keys j <= i + Sk - Sq
        allowed = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked row -> output 0
    return (probs @ vh).transpose(0, 1).to(q.dtype)  # (Sq, H, D)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
) -> Tensor:
    """flash_attn_interface.py ``flash_attn_func``: q (B, Sq, H, D), k/v (B, Sk, Hk, D)."""
    _check(q, k, v)
    if q.size(0) <= 0:
        raise RuntimeError("batch size must be positive")
    if q.size(0) != k.size(0) or k.shape != v.shape:
        raise RuntimeError("k must have shape (batch_size, seqlen_k, num_heads_k, head_size)")
    if window_size != (-1, -1):
        raise NotImplementedError("sliding windows are not emulated")
    if dropout_p > 0:
        raise NotImplementedError("dropout is not emulated (litmt tests run with p=0)")
    if q.size(1) == 1:  # mha_fwd: "causal=true is the same as causal=false in this case"
        causal = False
    CALLS.append({"fn": "flash_attn_func", "causal": causal})
    scale = q.size(-1) ** -0.5 if softmax_scale is None else softmax_scale
    return torch.stack([_attend(q[b], k[b], v[b], causal, scale) for b in range(q.size(0))])


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
) -> Tensor:
    """flash_attn_interface.py ``flash_attn_varlen_func``: q (total_q, H, D), k/v (total_k, Hk, D).

    Sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] against k/v[cu_seqlens_k[b]:...].
    """
    _check(q, k, v)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32:
            raise RuntimeError(f"{name} must have dtype int32")
        if not cu.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")
        if cu.dim() != 1:
            raise RuntimeError(f"{name} must have shape (batch_size + 1)")
        if not ALLOW_CPU_FP32["on"] and not cu.is_cuda:
            raise RuntimeError(f"{name} must be on CUDA")
    batch_size = cu_seqlens_q.numel() - 1
    if batch_size <= 0:
        raise RuntimeError("batch size must be positive")
    if cu_seqlens_k.numel() != batch_size + 1:  # CHECK_SHAPE(cu_seqlens_k, batch_size + 1)
        raise RuntimeError("cu_seqlens_k must have shape (batch_size + 1)")
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if cq[-1] != q.size(0) or ck[-1] != k.size(0) or k.shape != v.shape:
        raise RuntimeError("q/k/v must have shape (total, num_heads, head_size)")
    if window_size != (-1, -1):
        raise NotImplementedError("sliding windows are not emulated")
    if dropout_p > 0:
        raise NotImplementedError("dropout is not emulated (litmt tests run with p=0)")
    if max_seqlen_q == 1:  # mha_varlen_fwd: causal=true is the same as causal=false
        causal = False
    CALLS.append({"fn": "flash_attn_varlen_func", "causal": causal, "cu_q": cq, "cu_k": ck})
    scale = q.size(-1) ** -0.5 if softmax_scale is None else softmax_scale
    out = q.new_zeros(q.shape)
    for b in range(batch_size):
        if cq[b + 1] - cq[b] > max_seqlen_q or ck[b + 1] - ck[b] > max_seqlen_k:
            raise ValueError("a sequence is longer than max_seqlen: undefined in flash-attn")
        qs, ks, vs = q[cq[b] : cq[b + 1]], k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]]
        if qs.size(0):
            out[cq[b] : cq[b + 1]] = _attend(qs, ks, vs, causal, scale)
    return out


def install(monkeypatch: pytest.MonkeyPatch, *, allow_cpu_fp32: bool) -> list[dict]:
    """Make ``import flash_attn`` return this emulation; returns `CALLS`."""
    mod = types.ModuleType("flash_attn")
    mod.flash_attn_func = flash_attn_func
    mod.flash_attn_varlen_func = flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", mod)
    monkeypatch.setitem(ALLOW_CPU_FP32, "on", allow_cpu_fp32)
    emulate_current_device(monkeypatch)
    CALLS.clear()
    return CALLS
