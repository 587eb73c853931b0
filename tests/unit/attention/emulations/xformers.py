"""xFormers' ``memory_efficient_attention`` and attention biases on CPU, following xFormers.

Shapes: B batch, M sequence length, H heads, K head dim (xFormers' BMHK layout).

Sources (facebookresearch/xformers, at the last release that kept the implementation in
``xformers/ops/fmha/``, before it moved to the mslk package):

- ``xformers/ops/fmha/attn_bias.py``: ``_get_default_bias_device`` (no ``device`` -> the
  current CUDA device if CUDA is available, else CPU), ``_SeqLenInfo.from_seqlens`` /
  ``_get_seqstart`` (Python ints, not a tensor; int32 ``seqstart`` on that device),
  ``BlockDiagonalMask.from_seqlens(q_seqlen, kv_seqlen=None, *, device=None)`` and
  ``materialize``, ``BlockDiagonalCausalMask`` (top-left causal inside each block),
  ``LowerTriangularMask`` (top-left), ``LowerTriangularFromBottomRightMask``,
  ``_materialize_causal_mask``;
- ``xformers/ops/fmha/common.py``: ``Inputs.validate_inputs`` (ndim, one device for q/k/v,
  a block-diagonal bias on the queries' device, one dtype, batch 1 with block-diagonal
  biases, 0 <= p <= 1, BMHK shapes);
- ``xformers/ops/fmha/__init__.py``: ``memory_efficient_attention`` (signature; the
  "equivalent pytorch code": softmax(q kᵀ · K^-1/2 + bias) v).

`DEFAULT_DEVICE` stands for "the current CUDA device" of ``_get_default_bias_device``; a
test can point it elsewhere to play a process whose current device is not the tensors'
(``translate device=cuda:1``). ``from_seqlens`` calls are recorded in `CALLS`.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from . import emulate_current_device

ALLOW_CPU_FP32 = {"on": False}  # set by `install`; see the package docstring
DEFAULT_DEVICE: dict[str, torch.device | None] = {"device": None}
CALLS: list[dict[str, Any]] = []


def _get_default_bias_device(device: torch.device | None = None) -> torch.device:
    """attn_bias.py ``_get_default_bias_device``."""
    if device is None:
        if DEFAULT_DEVICE["device"] is not None:  # the emulated "current CUDA device"
            return DEFAULT_DEVICE["device"]
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


class AttentionBias:
    """attn_bias.py ``AttentionBias``: materialize(shape) -> additive bias (0 / -inf)."""

    def materialize(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
        raise NotImplementedError


def _materialize_causal_mask(
    shape: tuple[int, ...], dtype: torch.dtype, from_bottomright: bool
) -> Tensor:
    """attn_bias.py ``_materialize_causal_mask``: log(tril(ones, shift)), shift = Mk - Mq."""
    num_queries, num_keys = shape[-2:]
    shift = num_keys - num_queries if from_bottomright else 0
    return torch.ones(shape, dtype=dtype).tril(diagonal=shift).log()


class LowerTriangularMask(AttentionBias):
    """attn_bias.py ``LowerTriangularMask``: top-left causal; ``device`` is unused."""

    def __init__(self, device: torch.device | None = None) -> None:
        pass

    def materialize(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
        return _materialize_causal_mask(shape, dtype, from_bottomright=False)


class LowerTriangularFromBottomRightMask(AttentionBias):
    """attn_bias.py ``LowerTriangularFromBottomRightMask``: the last query sees the last key."""

    def materialize(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
        return _materialize_causal_mask(shape, dtype, from_bottomright=True)


@dataclass
class _SeqLenInfo:
    """attn_bias.py ``_SeqLenInfo``."""

    seqstart: Tensor
    max_seqlen: int
    min_seqlen: int
    seqstart_py: list[int]

    @classmethod
    def from_seqlens(cls, seqlens: Any, *, device: torch.device | None = None) -> _SeqLenInfo:
        device = _get_default_bias_device(device)
        assert not isinstance(seqlens, torch.Tensor)  # _get_seqstart: Python ints only
        seqstart_py = [0]
        for n in seqlens:
            seqstart_py.append(seqstart_py[-1] + n)
        # _to_device_tensor: int32 on `device` ("meta" stands in for another GPU here)
        seqstart = torch.tensor(seqstart_py, dtype=torch.int32).to(device)
        lengths = list(seqlens)
        return cls(seqstart, max(lengths), min(lengths), seqstart_py)

    def intervals(self) -> list[tuple[int, int]]:
        return list(zip(self.seqstart_py, self.seqstart_py[1:], strict=False))


@dataclass
class BlockDiagonalMask(AttentionBias):
    """attn_bias.py ``BlockDiagonalMask``: queries of block i attend the keys of block i."""

    q_seqinfo: _SeqLenInfo
    k_seqinfo: _SeqLenInfo

    @classmethod
    def from_seqlens(
        cls,
        q_seqlen: Any,
        kv_seqlen: Any = None,
        *,
        device: torch.device | None = None,
    ) -> BlockDiagonalMask:
        """attn_bias.py ``BlockDiagonalMask.from_seqlens``."""
        CALLS.append({"cls": cls.__name__, "q": list(q_seqlen), "device": device})
        device = _get_default_bias_device(device)
        assert kv_seqlen is None or len(q_seqlen) == len(kv_seqlen)
        q_seqinfo = _SeqLenInfo.from_seqlens(q_seqlen, device=device)
        if kv_seqlen is None or q_seqlen == kv_seqlen:
            k_seqinfo = q_seqinfo
        else:
            k_seqinfo = _SeqLenInfo.from_seqlens(kv_seqlen, device=device)
        return cls(q_seqinfo=q_seqinfo, k_seqinfo=k_seqinfo)

    def _create_block_mask(self, shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
        return torch.zeros(shape, dtype=dtype)

    def materialize(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
        """attn_bias.py ``BlockDiagonalMask.materialize``."""
        assert shape[-1] == self.k_seqinfo.seqstart_py[-1]
        assert shape[-2] == self.q_seqinfo.seqstart_py[-1]
        mask = torch.full(shape[-2:], -math.inf, dtype=dtype)
        for (q0, q1), (k0, k1) in zip(
            self.q_seqinfo.intervals(), self.k_seqinfo.intervals(), strict=True
        ):
            mask[q0:q1, k0:k1] = self._create_block_mask((q1 - q0, k1 - k0), dtype)
        return mask.expand(shape)


@dataclass
class BlockDiagonalCausalMask(BlockDiagonalMask):
    """attn_bias.py ``BlockDiagonalCausalMask``: each block top-left causal."""

    def _create_block_mask(self, shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
        return LowerTriangularMask().materialize(shape, dtype)


def _validate_inputs(q: Tensor, k: Tensor, v: Tensor, attn_bias: Any, p: float) -> None:
    """common.py ``Inputs.validate_inputs`` (the BMHK cases)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("Query/Key/Value should all have BMGHK, BMHK or BMK shape.")
    if any(x.device != q.device for x in (k, v)):
        raise ValueError("Query/Key/Value should all be on the same device")
    if isinstance(attn_bias, BlockDiagonalMask):
        bias_device = attn_bias.q_seqinfo.seqstart.device
        if bias_device != q.device:
            raise ValueError(
                "Attention bias and Query/Key/Value should be on the same device\n"
                f"  query.device: {q.device}\n  attn_bias   : {bias_device}\n"
            )
    if not (k.dtype == v.dtype == q.dtype):
        raise ValueError("Query/Key/Value should either all have the same dtype")
    if isinstance(attn_bias, BlockDiagonalMask) and any(x.shape[0] != 1 for x in (q, k, v)):
        raise ValueError("Expected batch_size=1 when using block-diagonal bias")
    if p < 0.0 or p > 1.0:
        raise ValueError(f"Invalid dropout probability: p={p}")
    b, _, h, kdim = q.shape
    mkv = k.shape[1]
    if k.shape != (b, mkv, h, kdim) or v.shape[:3] != (b, mkv, h):
        raise ValueError("Incompatible shapes for attention inputs")


def memory_efficient_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_bias: Any = None,
    p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """__init__.py ``memory_efficient_attention``: (B, Mq, H, K) -> (B, Mq, H, Kv)."""
    _validate_inputs(query, key, value, attn_bias, p)
    if not ALLOW_CPU_FP32["on"] and not query.is_cuda:
        # dispatch finds no CPU operator
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward`")
    if p > 0:
        raise NotImplementedError("dropout is not emulated (litmt tests run with p=0)")
    scale = 1.0 / query.shape[-1] ** 0.5 if scale is None else scale
    q, k, v = (t.transpose(1, 2).double() for t in (query, key, value))  # (B, H, M, K)
    attn = (q * scale) @ k.transpose(-2, -1)  # (B, H, Mq, Mkv)
    if attn_bias is not None:
        attn = attn + attn_bias.materialize(tuple(attn.shape), dtype=attn.dtype)
    out = attn.softmax(-1) @ v  # a fully masked row is NaN, as the docs warn
    return out.transpose(1, 2).to(query.dtype)


def install(monkeypatch: pytest.MonkeyPatch, *, allow_cpu_fp32: bool) -> list[dict[str, Any]]:
    """Make ``xformers.ops`` and ``xformers.ops.fmha.attn_bias`` this emulation; returns `CALLS`."""
    bias = types.ModuleType("xformers.ops.fmha.attn_bias")
    for obj in (
        AttentionBias,
        LowerTriangularMask,
        LowerTriangularFromBottomRightMask,
        BlockDiagonalMask,
        BlockDiagonalCausalMask,
    ):
        setattr(bias, obj.__name__, obj)
    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.attn_bias = bias
    fmha.memory_efficient_attention = memory_efficient_attention
    ops = types.ModuleType("xformers.ops")
    ops.fmha, ops.memory_efficient_attention = fmha, memory_efficient_attention
    root = types.ModuleType("xformers")
    root.ops = ops
    for name, mod in (
        ("xformers", root),
        ("xformers.ops", ops),
        ("xformers.ops.fmha", fmha),
        ("xformers.ops.fmha.attn_bias", bias),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(ALLOW_CPU_FP32, "on", allow_cpu_fp32)
    emulate_current_device(monkeypatch)
    monkeypatch.setitem(DEFAULT_DEVICE, "device", None)
    CALLS.clear()
    return CALLS
