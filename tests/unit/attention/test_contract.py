"""The kernel contract: math and sdpa against a hand-written reference softmax(QKᵀ/√D + mask)·V,
weights (`forward_with_weights`) and support declarations."""

from __future__ import annotations

import math

import pytest
import torch
from attention_cases import CASES as ALL_CASES
from attention_cases import lengths_mask, make_inputs

from litmt.attention import backend_support, build_backend, list_backends
from litmt.attention.base import AttentionRequest
from litmt.errors import BackendError

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

EXACT = ["math", "sdpa"]


def reference(q, k, v, key_padding_mask=None, causal=False):
    """Independent reference in (B, H, T, D) layout with an additive -inf mask."""
    q, k, v = (t.permute(0, 2, 1, 3).double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    add = torch.zeros_like(scores)
    if key_padding_mask is not None:
        add = add.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        tq, tk = scores.shape[-2:]
        future = torch.ones(tq, tk, dtype=torch.bool).triu(1)
        add = add.masked_fill(future, float("-inf"))
    out = torch.softmax(scores + add, dim=-1) @ v
    return out.permute(0, 2, 1, 3).float()


# the reference aligns a causal mask top-left: the cases with Tq == Tk or without causal
CASES = {name: c for name, c in ALL_CASES.items() if not name.startswith("decode")}


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(backend, case):
    c = CASES[case]
    b, h, d = 3, 4, 16
    q, k, v, mask = make_inputs(c, b, h, d)
    out = build_backend(backend)(q, k, v, key_padding_mask=mask, causal=c["causal"])
    assert out.shape == (b, c["tq"], h, d)
    assert torch.isfinite(out).all(), "outputs (also at padded query positions) must be finite"
    ref = reference(q, k, v, mask, c["causal"])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", EXACT)
def test_fully_padded_row_is_finite(backend):
    q, k, v = torch.randn(2, 3, 2, 8), torch.randn(2, 4, 2, 8), torch.randn(2, 4, 2, 8)
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    for causal in (False, True):
        kk = k if not causal else k[:, :3]
        vv = v if not causal else v[:, :3]
        m = mask if not causal else mask[:, :3]
        out = build_backend(backend)(q, kk, vv, key_padding_mask=m, causal=causal)
        assert torch.isfinite(out).all()
        ref = reference(q[:1], kk[:1], vv[:1], m[:1], causal)
        torch.testing.assert_close(out[:1], ref, atol=1e-5, rtol=1e-5)


def test_math_returns_weights_that_sum_to_one():
    q, k, v = torch.randn(2, 5, 2, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 8)
    mask = lengths_mask([6, 3], 6)
    out, w = build_backend("math").forward_with_weights(q, k, v, key_padding_mask=mask)
    assert w.shape == (2, 2, 5, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 5))
    assert w[1, :, :, 3:].abs().max() == 0, "padding keys must get zero weight"
    torch.testing.assert_close(out, reference(q, k, v, mask))


def test_registry_lists_every_backend_and_rejects_unknown_names():
    names = list_backends()
    for name in ["math", "sdpa", "flash", "xformers", "te", "flex", "local", "sparse", "linear"]:
        assert name in names
    with pytest.raises(
        BackendError, match=r"unknown attention backend 'nope'; valid names: .*math.*sdpa"
    ):
        build_backend("nope")


# Kernels that return their own weights, with options that make them differ from `math`.
OWN_WEIGHTS = {
    "math": {},
    "local": {"window": 2},
    "sparse": {"block_size": 2, "stride": 2},
    "linear": {"chunk_size": 3},
}
WEIGHT_CASES = ["self", "padding", "causal", "causal_padding", "decode_chunk"]


def weight_inputs(case: str):
    c = {**CASES, "decode_chunk": dict(tq=3, tk=10, lengths=None, causal=True)}[case]
    q, k, v, mask = make_inputs(c, 3, 2, 8, generator=torch.Generator().manual_seed(0))
    return q, k, v, mask, c["causal"]


@pytest.mark.parametrize("case", WEIGHT_CASES)
@pytest.mark.parametrize("backend", sorted(OWN_WEIGHTS))
def test_own_weights_are_what_the_kernel_computes(backend, case):
    """weights @ V == forward's output, so a heatmap shows the attention actually applied."""
    q, k, v, mask, causal = weight_inputs(case)
    kernel = build_backend(backend, **OWN_WEIGHTS[backend])
    assert kernel.support.weights
    out = kernel(q, k, v, key_padding_mask=mask, causal=causal)
    out_w, w = kernel.forward_with_weights(q, k, v, key_padding_mask=mask, causal=causal)
    assert w.shape == (3, 2, q.size(1), k.size(1))
    by_weights = torch.einsum("bhqk,bkhd->bqhd", w, v)
    real = torch.ones(3, q.size(1), dtype=torch.bool)  # (B, Tq) queries with a real key
    if mask is not None:  # padded queries of local/sparse may have none: not compared
        real = ~mask[:, : q.size(1)]
    torch.testing.assert_close(out[real], out_w[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[real], by_weights[real], atol=1e-5, rtol=1e-5)
    if mask is not None:  # real queries give padded keys nothing
        on_padding = w.masked_fill(~mask[:, None, None, :], 0).sum(dim=(1, 3))  # (B, Tq)
        assert on_padding[real].abs().max() == 0, "padding got weight"
    if causal:
        future = torch.ones(q.size(1), k.size(1), dtype=torch.bool).triu(k.size(1) - q.size(1) + 1)
        assert w[..., future].abs().max() == 0, "a future key got weight"


@pytest.mark.parametrize("case", WEIGHT_CASES)
@pytest.mark.parametrize(
    "pattern", [{"window": 2}, {"sparse": "strided", "sparse_block_size": 2, "sparse_stride": 2}]
)
def test_flex_weights_are_math_under_its_own_pattern(pattern, case):
    """Fused, so its weights are recomputed, but under its window / layout, not full attention."""
    q, k, v, mask, causal = weight_inputs(case)
    kernel = build_backend("flex", compile=False, **pattern)
    out = kernel(q, k, v, key_padding_mask=mask, causal=causal)
    out_w, w = kernel.forward_with_weights(q, k, v, key_padding_mask=mask, causal=causal)
    real = torch.ones(3, q.size(1), dtype=torch.bool) if mask is None else ~mask[:, : q.size(1)]
    torch.testing.assert_close(out[real], out_w[real], atol=1e-5, rtol=1e-5)
    assert (w == 0).any(), "the pattern must leave some keys out"


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_fused_kernels_fall_back_to_math_weights(backend):
    q, k, v, mask, causal = weight_inputs("causal_padding")
    kernel = build_backend(backend)
    assert not kernel.support.weights
    out, w = kernel.forward_with_weights(q, k, v, key_padding_mask=mask, causal=causal)
    out_m, w_m = build_backend("math").forward_with_weights(
        q, k, v, key_padding_mask=mask, causal=causal
    )
    torch.testing.assert_close(w, w_m, rtol=0, atol=0)
    torch.testing.assert_close(out, out_m, rtol=0, atol=0)


def test_support_declarations_and_build_time_validation():
    assert backend_support("math").weights and not backend_support("sdpa").weights
    for name in ("local", "sparse"):  # positions of two sequences: no window/layout
        assert not backend_support(name).cross
        with pytest.raises(BackendError, match=rf"'{name}' \(at cross\) needs query and key"):
            build_backend(name).validate(AttentionRequest(site="cross"))
        build_backend(name).validate(AttentionRequest(site="decoder_self", causal=True))
    build_backend("linear").validate(AttentionRequest(site="cross"))
    with pytest.raises(BackendError, match="takes no options"):
        build_backend("sdpa", window=3)


def test_dropout_is_applied_only_when_asked():
    q = k = v = torch.randn(2, 6, 2, 8)
    for backend in EXACT:
        kern = build_backend(backend)
        a = kern(q, k, v, dropout_p=0.0)
        torch.testing.assert_close(a, kern(q, k, v, dropout_p=0.0))
        assert not torch.allclose(a, kern(q, k, v, dropout_p=0.5))
