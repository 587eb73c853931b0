"""Transformer Engine's ``DotProductAttention`` on CPU, following TE's own rules.

Shapes: B batch, Sq/Skv query/key length, H heads, D head dim.

Sources (NVIDIA/TransformerEngine, ``transformer_engine/pytorch/``):

- ``attention/dot_product_attention/dot_product_attention.py``: ``DotProductAttention``
  (``__init__`` defaults and ``forward``: mask-type normalisation, diagonal alignment,
  qkv_format, and how ``cu_seqlens_q/kv`` come from ``attention_mask`` per
  ``attention_type``);
- ``attention/dot_product_attention/utils.py``: ``get_cu_seqlens``, ``get_full_cu_seqlens``,
  ``get_indices``, ``get_full_mask``;
- ``attention/dot_product_attention/backends.py``: ``FlashAttention.forward`` (packing by
  ``get_indices`` and zero-filled unpacking, ``UnpackTensor``);
- ``constants.py``: ``AttnMaskTypes``, ``AttnTypes``;
- ``csrc/extensions/attention.cpp``: ``fused_attn_fwd`` (the cuDNN fused backend allocates
  O uninitialised and zeroes it only for the THD format, so padded query rows of bshd/sbhd
  outputs hold whatever the memory held; emulated as NaN).

The device rule: ``get_cu_seqlens`` builds its leading zero with ``device="cuda"``, the
*current* CUDA device, and concatenates it with lengths on the mask's device (emulated with
the package's `current_device`). ``DotProductAttention.forward`` passes
``is_training=self.training`` to ``get_attention_backend`` (which drops backends without a
backward, e.g. FlashAttention 3 for FP8 training), recorded per call.

TE picks its backend per call; this emulation is the cuDNN fused backend (TE's first choice
on sm90 for bshd), whose padded query rows are not zeroed. FlashAttention's backend zero-fills
them (``backends.py``, ``UnpackTensor``); litmt must not rely on either.

The attention itself is softmax(q kᵀ · scale + mask) v in float64. Every call is recorded
in `CALLS` (attention type, mask type, the derived cu_seqlens) so tests can check the
lengths TE would have used.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import check_same_device, current_device, emulate_current_device

# constants.py: AttnMaskTypes, AttnTypes
ATTN_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
ATTN_TYPES = ("self", "cross")

ALLOW_CPU_FP32 = {"on": False}  # set by `install`; see the package docstring


@dataclass
class Call:
    """What one forward call derived (for assertions in tests)."""

    attention_type: str
    attn_mask_type: str
    cu_seqlens_q: list[int]
    cu_seqlens_kv: list[int]
    is_training: bool = True


CALLS: list[Call] = []


def get_cu_seqlens(mask: Tensor) -> Tensor:
    """utils.py ``get_cu_seqlens``: (B, 1, 1, S) bool, True = padding -> (B+1,) int32.

    Only the *count* of unmasked positions matters: TE assumes right padding. The leading
    zero is made with ``device="cuda"``: the current device, not the mask's.
    """
    mask = mask.squeeze(1).squeeze(1)
    reduced = mask.logical_not().sum(dim=1)
    check_same_device(current_device(), reduced)  # torch.cat((zero, cu_seqlens))
    return torch.cat([torch.zeros(1, dtype=torch.int32), reduced.cumsum(0).to(torch.int32)])


def get_full_cu_seqlens(batch_size: int, max_seqlen: int) -> Tensor:
    """utils.py ``get_full_cu_seqlens``: every sequence has the maximum length."""
    return torch.arange(0, (batch_size + 1) * max_seqlen, max_seqlen, dtype=torch.int32)


def _valid(cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
    """utils.py ``get_indices``: position s of row b is real iff s < length[b]. (B, S) bool."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.arange(max_seqlen)[None, :] < lengths[:, None]


class DotProductAttention(nn.Module):
    """dot_product_attention.py ``DotProductAttention`` (the arguments litmt can use)."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int,
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",  # TE's default
        attn_mask_type: str = "causal",  # TE's default
        window_size: tuple[int, int] | None = None,
        layer_number: int | None = None,
        attention_type: str = "self",  # TE's default
        softmax_scale: float | None = None,
    ) -> None:
        super().__init__()
        # __init__: "attention_type {attention_type} not supported"
        assert attention_type in ATTN_TYPES, f"attention_type {attention_type} not supported"
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        assert num_attention_heads % self.num_gqa_groups == 0
        self.kv_channels = kv_channels
        self.attention_dropout = attention_dropout
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.attention_type = attention_type
        # __init__: softmax_scale defaults to 1 / sqrt(kv_channels)
        self.softmax_scale = (
            1.0 / math.sqrt(kv_channels) if softmax_scale is None else softmax_scale
        )

    def forward(
        self,
        query_layer: Tensor,
        key_layer: Tensor,
        value_layer: Tensor,
        attention_mask: Tensor | tuple[Tensor, Tensor] | None = None,
        qkv_format: str | None = None,
        cu_seqlens_q: Tensor | None = None,
        cu_seqlens_kv: Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
    ) -> Tensor:
        """forward: (B, Sq, H, D) ("bshd") or (Sq, B, H, D) ("sbhd") -> (.., .., H*D)."""
        q, k, v = query_layer, key_layer, value_layer
        # forward, "checks for q/k/v shapes"
        if not ALLOW_CPU_FP32["on"]:
            assert q.is_cuda and k.is_cuda and v.is_cuda, (
                "DotProductAttention only supports CUDA tensors."
            )
            assert q.dtype in (torch.float16, torch.bfloat16), "TE attention runs fp16/bf16"
        assert q.dtype == k.dtype == v.dtype, (
            "Queries, keys and values must have the same data type!"
        )
        assert k.shape[:-1] == v.shape[:-1], (
            "Keys and values must have the same batch size, sequence length and number of heads!"
        )
        assert q.shape[-1] == k.shape[-1] == self.kv_channels, "head_dim != kv_channels"
        assert q.shape[-2] == self.num_attention_heads
        assert k.shape[-2] == self.num_gqa_groups

        # forward, "checks for attention mask": None -> the module's type; "," -> "_"
        if attn_mask_type is None:
            attn_mask_type = self.attn_mask_type
        else:
            attn_mask_type = attn_mask_type.replace(",", "_")
            if attn_mask_type == "causal_padding":
                attn_mask_type = "padding_causal"
        assert attn_mask_type in ATTN_MASK_TYPES, (
            f"Attention mask type {attn_mask_type} is not supported!"
        )

        # forward, "checks for qkv_format"
        qkv_format = self.qkv_format if qkv_format is None else qkv_format
        assert qkv_format in ("sbhd", "bshd"), "this emulation covers sbhd and bshd"
        assert q.dim() == k.dim() == v.dim() == 4, (
            f"Queries, keys and values must be 4D tensors when {qkv_format=}!"
        )
        if qkv_format == "sbhd":
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # -> (B, S, H, D)
        batch_size = q.shape[0]
        max_seqlen_q = q.shape[1] if max_seqlen_q is None else max_seqlen_q
        max_seqlen_kv = k.shape[1] if max_seqlen_kv is None else max_seqlen_kv

        # forward, "adjust max_seqlen and cu_seqlens": a padding mask type turns
        # attention_mask into sequence lengths; "self" takes BOTH from the one mask.
        if cu_seqlens_q is None:
            if "padding" in attn_mask_type:
                assert attention_mask is not None, "Please provide attention_mask for padding!"
                if self.attention_type == "self":
                    cu_seqlens_q = get_cu_seqlens(attention_mask)
                else:
                    cu_seqlens_q = get_cu_seqlens(attention_mask[0])
            else:
                cu_seqlens_q = get_full_cu_seqlens(batch_size, max_seqlen_q)
        if cu_seqlens_kv is None:
            if "padding" in attn_mask_type:
                if self.attention_type == "self":
                    cu_seqlens_kv = get_cu_seqlens(attention_mask)
                else:
                    cu_seqlens_kv = get_cu_seqlens(attention_mask[1])
            else:
                cu_seqlens_kv = get_full_cu_seqlens(batch_size, max_seqlen_kv)
        if self.attention_type == "self" and "padding" in attn_mask_type:
            # backends.py FlashAttention.forward: "Maximum sequence length for Q and KV
            # should be the same." (the one mask serves both)
            assert max_seqlen_q == max_seqlen_kv, (
                "Maximum sequence length for Q and KV should be the same."
            )
        CALLS.append(
            Call(
                self.attention_type,
                attn_mask_type,
                cu_seqlens_q.tolist(),
                cu_seqlens_kv.tolist(),
                is_training=self.training,  # forward: get_attention_backend(is_training=...)
            )
        )

        # Which (query, key) pairs are attended: utils.py get_full_mask.
        q_real = _valid(cu_seqlens_q, max_seqlen_q)  # (B, Sq)
        kv_real = _valid(cu_seqlens_kv, max_seqlen_kv)  # (B, Skv)
        len_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).view(-1, 1, 1)  # (B, 1, 1)
        len_kv = (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).view(-1, 1, 1)
        i = torch.arange(max_seqlen_q).view(1, -1, 1)  # query index
        j = torch.arange(max_seqlen_kv).view(1, 1, -1)  # key index
        allowed = kv_real[:, None, :] & q_real[:, :, None]  # (B, Sq, Skv)
        if attn_mask_type in ("causal", "padding_causal"):
            # forward: bottom_right_diagonal = False for these; "always top left"
            allowed = allowed & (j <= i)
        elif attn_mask_type == "causal_bottom_right":
            allowed = allowed & (j <= i + max_seqlen_kv - max_seqlen_q)
        elif attn_mask_type == "padding_causal_bottom_right":
            # get_full_mask: aligned to each row's *actual* lengths, not the padded ones
            allowed = allowed & (j <= i + len_kv - len_q)
        elif attn_mask_type == "arbitrary":
            # broadcastable to (B, H, Sq, Skv), True = masked out
            arb = ~attention_mask.expand(batch_size, -1, max_seqlen_q, max_seqlen_kv)
            allowed = allowed[:, None] & arb  # (B, H|1, Sq, Skv)
        if allowed.dim() == 3:
            allowed = allowed[:, None]  # (B, 1, Sq, Skv)

        qh, kh, vh = (t.permute(0, 2, 1, 3).double() for t in (q, k, v))  # (B, H, S, D)
        rep = self.num_attention_heads // self.num_gqa_groups
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) * self.softmax_scale  # (B, H, Sq, Skv)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked row -> 0
        if self.training and self.attention_dropout > 0:
            probs = F.dropout(probs, p=self.attention_dropout)
        vh = vh.masked_fill(~kv_real[:, None, :, None], 0.0)  # keys past cu_seqlens: unread
        out = (probs @ vh).to(q.dtype)  # (B, H, Sq, D)
        # attention.cpp fused_attn_fwd: O is zeroed only for THD; bshd/sbhd padded query
        # rows keep uninitialised memory
        out = out.masked_fill(~q_real[:, None, :, None], float("nan"))
        out = out.permute(0, 2, 1, 3).reshape(batch_size, max_seqlen_q, -1)  # (B, Sq, H*D)
        if qkv_format == "sbhd":
            out = out.transpose(0, 1)
        return out.contiguous()


def install(monkeypatch: pytest.MonkeyPatch, *, allow_cpu_fp32: bool) -> list[Call]:
    """Make ``import transformer_engine.pytorch`` return this emulation; returns `CALLS`."""
    te = types.ModuleType("transformer_engine.pytorch")
    te.DotProductAttention = DotProductAttention
    root = types.ModuleType("transformer_engine")
    root.pytorch = te
    monkeypatch.setitem(sys.modules, "transformer_engine", root)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    monkeypatch.setitem(ALLOW_CPU_FP32, "on", allow_cpu_fp32)
    emulate_current_device(monkeypatch)
    CALLS.clear()
    return CALLS
