"""The emulations follow their library's rules, and litmt's backends use them correctly.

Each rule asserted here is quoted from the library source named in the emulation module.
The backend-level tests (xFormers bias device, TE self/cross table) fail on the code before
the GPU-correctness fixes.
"""

from __future__ import annotations

import pytest
import torch

from litmt.attention import build_backend, get_backend_class

from . import CURRENT_DEVICE, allow_cpu_fp32
from . import flash_attn as flash_emulation
from . import transformer_engine as te_emulation
from . import xformers as xformers_emulation


def qkv(b: int, tq: int, tk: int, h: int = 2, d: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, tq, h, d, generator=gen),
        torch.randn(b, tk, h, d, generator=gen),
        torch.randn(b, tk, h, d, generator=gen),
    )


def right_padding(lengths: list[int], t: int) -> torch.Tensor:
    """(B, T) bool, True = padding."""
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def on_the_tensors_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct calls of an emulation: the CPU tensors' device is the current device."""
    monkeypatch.setitem(CURRENT_DEVICE, "device", torch.device("cpu"))


# -- Transformer Engine -----------------------------------------------------------------------
def test_te_self_attention_takes_query_lengths_from_the_one_mask(monkeypatch):
    """dot_product_attention.py: "self" -> cu_seqlens_q = get_cu_seqlens(attention_mask)."""
    calls = te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    on_the_tensors_device(monkeypatch)
    te = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="self")
    q, k, v = qkv(2, 4, 4)
    mask = right_padding([4, 2], 4)[:, None, None, :]  # (B, 1, 1, S)
    out = te(q, k, v, attention_mask=mask, attn_mask_type="padding")  # (B, S, H*D)
    assert calls[-1].cu_seqlens_q == calls[-1].cu_seqlens_kv == [0, 4, 6]
    assert out[1, 2:].isnan().all()  # rows past the (key) length: uninitialised (bshd, cuDNN)
    cross = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="cross")
    q_mask = torch.zeros(2, 1, 1, 4, dtype=torch.bool)
    out = cross(q, k, v, attention_mask=(q_mask, mask), attn_mask_type="padding")
    assert calls[-1].cu_seqlens_q == [0, 4, 8] and calls[-1].cu_seqlens_kv == [0, 4, 6]
    assert out[1, 2:].abs().min() > 0


def test_te_defaults_and_diagonals_follow_transformer_engine(monkeypatch):
    te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    on_the_tensors_device(monkeypatch)
    te = te_emulation.DotProductAttention(2, 8)  # TE defaults: sbhd, causal, self
    assert (te.qkv_format, te.attn_mask_type, te.attention_type) == ("sbhd", "causal", "self")
    q, k, v = qkv(1, 2, 5)
    ref = build_backend("math")
    # causal_bottom_right: query i sees j <= i + Sk - Sq, as the contract's causal
    out = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="cross")(
        q, k, v, attn_mask_type="causal_bottom_right"
    )
    torch.testing.assert_close(out.view(1, 2, 2, 8), ref(q, k, v, causal=True))
    # "causal" is top-left: query 0 sees key 0 only
    out = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="cross")(
        q, k, v, attn_mask_type="causal"
    )
    torch.testing.assert_close(out.view(1, 2, 2, 8)[:, 0], v[:, 0])
    # padding_causal_bottom_right aligns to each row's *actual* lengths (get_full_mask)
    kv_mask = right_padding([3], 5)[:, None, None, :]
    q_mask = torch.zeros(1, 1, 1, 2, dtype=torch.bool)
    out = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="cross")(
        q, k, v, attention_mask=(q_mask, kv_mask), attn_mask_type="padding_causal_bottom_right"
    )
    real = ref(q, k[:, :3], v[:, :3], causal=True)  # as if Sk were 3
    torch.testing.assert_close(out.view(1, 2, 2, 8), real)
    with pytest.raises(AssertionError, match="Maximum sequence length for Q and KV"):
        te_emulation.DotProductAttention(2, 8, qkv_format="bshd")(
            q, k, v, attention_mask=kv_mask, attn_mask_type="padding"
        )


def test_te_refuses_cpu_fp32_unless_relaxed(monkeypatch):
    te_emulation.install(monkeypatch, allow_cpu_fp32=False)
    q, k, v = qkv(1, 3, 3)
    with pytest.raises(AssertionError, match="only supports CUDA tensors"):
        te_emulation.DotProductAttention(2, 8, qkv_format="bshd")(q, k, v)


TE_TABLE = [
    # (site is self-attention, Tq, Tk, padding, causal) -> (attention_type, attn_mask_type)
    ((True, 6, 6, False, False), ("self", "no_mask")),
    ((True, 6, 6, True, False), ("self", "padding")),
    ((True, 6, 6, False, True), ("self", "causal")),
    ((True, 6, 6, True, True), ("self", "padding_causal")),
    ((True, 1, 6, False, False), ("cross", "no_mask")),  # decode step against a cache
    ((True, 2, 6, False, True), ("cross", "causal_bottom_right")),
    ((False, 6, 6, True, False), ("cross", "padding")),  # the defect: Tq == Tk at cross
    ((False, 6, 6, False, False), ("cross", "no_mask")),
    ((False, 1, 1, True, False), ("cross", "padding")),
    ((False, 3, 6, True, False), ("cross", "padding")),
    ((None, 6, 6, True, False), ("cross", "padding")),  # standalone kernel: never guessed
]


def _te_id(row) -> str:
    (self_site, tq, tk, padding, causal), _ = row
    site = {True: "selfsite", False: "crosssite", None: "unbound"}[self_site]
    return f"{site}-{tq}x{tk}-{'pad' if padding else 'nopad'}-{'causal' if causal else 'full'}"


@pytest.mark.parametrize(("call", "expected"), TE_TABLE, ids=[_te_id(r) for r in TE_TABLE])
def test_te_chooses_self_or_cross_by_site_never_by_shapes(call, expected, monkeypatch):
    self_site, tq, tk, padding, causal = call
    calls = te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class("te"))
    kernel = build_backend("te")
    if self_site is not None:
        kernel.set_site("encoder_self" if self_site else "cross", self_attention=self_site)
    q, k, v = qkv(3, tq, tk)
    mask = right_padding([tk, max(tk - 2, 1), max(tk - 4, 1)], tk) if padding else None
    out = kernel(q, k, v, key_padding_mask=mask, causal=causal)
    assert (calls[-1].attention_type, calls[-1].attn_mask_type) == expected
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=causal)
    rows = ~mask if (padding and expected[0] == "self") else torch.ones(3, tq, dtype=torch.bool)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


def test_te_causal_padding_against_a_cache_stays_exact(monkeypatch):
    """TE would align the diagonal to the real lengths; the contract aligns to the padded."""
    calls = te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class("te"))
    q, k, v = qkv(2, 2, 6)
    mask = right_padding([6, 4], 6)
    out = build_backend("te")(q, k, v, key_padding_mask=mask, causal=True)
    assert calls == []  # not sent to TE
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# -- flash-attn -------------------------------------------------------------------------------
def test_flash_causal_is_bottom_right_and_empty_rows_are_zero(monkeypatch):
    """flash_attn_interface.py docstring, Sq = 5 and Sk = 2: rows 0-2 see nothing (output 0)."""
    flash_emulation.install(monkeypatch, allow_cpu_fp32=True)
    q, k, v = qkv(1, 5, 2)
    out = flash_emulation.flash_attn_func(q, k, v, causal=True)
    assert out[0, :3].abs().max() == 0
    torch.testing.assert_close(out[0, 3], v[0, 0])  # row 3 sees key 0 only
    q, k, v = qkv(1, 2, 5)
    torch.testing.assert_close(
        flash_emulation.flash_attn_func(q, k, v, causal=True),
        build_backend("math")(q, k, v, causal=True),
    )


def test_flash_varlen_checks_follow_flash_api(monkeypatch):
    flash_emulation.install(monkeypatch, allow_cpu_fp32=False)
    q, k, v = qkv(1, 4, 4)
    with pytest.raises(RuntimeError, match="only support fp16 and bf16"):
        flash_emulation.flash_attn_func(q, k, v)
    flash_emulation.install(monkeypatch, allow_cpu_fp32=True)
    cu = torch.tensor([0, 4], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must have dtype int32"):
        flash_emulation.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 4, 4)
    q6, k6, v6 = qkv(1, 4, 4, d=6)
    with pytest.raises(RuntimeError, match="head_size that is a multiple of 8"):
        flash_emulation.flash_attn_func(q6, k6, v6)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="longer than max_seqlen"):
        flash_emulation.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 3, 4)


# -- xFormers --------------------------------------------------------------------------------
def test_xformers_bias_device_defaults_to_the_current_device(monkeypatch):
    """attn_bias.py _get_default_bias_device + common.py validate_inputs."""
    xformers_emulation.install(monkeypatch, allow_cpu_fp32=True)
    monkeypatch.setitem(xformers_emulation.DEFAULT_DEVICE, "device", torch.device("meta"))
    bias = xformers_emulation.BlockDiagonalMask.from_seqlens([2, 3], [4, 1])
    assert bias.q_seqinfo.seqstart.device.type == "meta"  # not the tensors' device
    q, k, v = (t.reshape(1, -1, 2, 8) for t in qkv(1, 5, 5))
    with pytest.raises(ValueError, match="should be on the same device"):
        xformers_emulation.memory_efficient_attention(q, k, v, attn_bias=bias)
    bias = xformers_emulation.BlockDiagonalMask.from_seqlens([2, 3], [4, 1], device=q.device)
    out = xformers_emulation.memory_efficient_attention(q, k, v, attn_bias=bias)
    ref = build_backend("math")
    torch.testing.assert_close(out[:, :2], ref(q[:, :2], k[:, :4], v[:, :4]))
    torch.testing.assert_close(out[:, 2:], ref(q[:, 2:], k[:, 4:], v[:, 4:]))


@pytest.mark.parametrize("causal", [False, True])
def test_xformers_backend_builds_biases_on_the_tensors_device(causal, monkeypatch):
    """`translate device=cuda:1` with cuda:0 current: the bias must follow q (issue item 7).

    The emulated "current device" is `meta`; a bias left there is refused by xFormers'
    `validate_inputs`, as a cuda:0 bias is refused for cuda:1 tensors.
    """
    calls = xformers_emulation.install(monkeypatch, allow_cpu_fp32=True)
    monkeypatch.setitem(xformers_emulation.DEFAULT_DEVICE, "device", torch.device("meta"))
    allow_cpu_fp32(monkeypatch, get_backend_class("xformers"))
    q, k, v = qkv(3, 6, 6)
    mask = right_padding([6, 2, 4], 6)
    out = build_backend("xformers")(q, k, v, key_padding_mask=mask, causal=causal)
    assert calls and all(c["device"] == q.device for c in calls)
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=causal)
    rows = ~mask if causal else torch.ones(3, 6, dtype=torch.bool)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


def test_xformers_block_diagonal_needs_batch_one(monkeypatch):
    xformers_emulation.install(monkeypatch, allow_cpu_fp32=True)
    q, k, v = qkv(2, 3, 3)
    bias = xformers_emulation.BlockDiagonalMask.from_seqlens([3, 3], device=q.device)
    with pytest.raises(ValueError, match="Expected batch_size=1"):
        xformers_emulation.memory_efficient_attention(q, k, v, attn_bias=bias)


def test_te_padding_masks_become_lengths_so_padding_must_be_on_the_right(monkeypatch):
    """utils.py get_cu_seqlens counts the unmasked positions; get_indices then keeps the
    first `length` positions. A left-padded row would lose its last tokens instead."""
    calls = te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    on_the_tensors_device(monkeypatch)
    te = te_emulation.DotProductAttention(2, 8, qkv_format="bshd", attention_type="cross")
    q, k, v = qkv(1, 2, 4)
    q_mask = torch.zeros(1, 1, 1, 2, dtype=torch.bool)
    left = torch.tensor([True, False, False, False])[None, None, None, :]  # key 0 is padding
    out = te(q, k, v, attention_mask=(q_mask, left), attn_mask_type="padding")
    assert calls[-1].cu_seqlens_kv == [0, 3]
    first_three = build_backend("math")(q, k[:, :3], v[:, :3])  # keys 0-2, padding included
    torch.testing.assert_close(out.view(1, 2, 2, 8), first_three)
