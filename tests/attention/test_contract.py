"""math and sdpa against a hand-written reference softmax(QKᵀ/√D + mask)·V."""

from __future__ import annotations

import math

import pytest
import torch

from litmt.attention import backend_support, build_backend, list_backends
from litmt.attention.base import AttentionRequest
from litmt.errors import BackendError

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


def lengths_mask(lengths, t):
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]  # True = pad


CASES = {
    "self": dict(tq=9, tk=9, lengths=None, causal=False),
    "cross_tq_ne_tk": dict(tq=5, tk=11, lengths=None, causal=False),
    "padding": dict(tq=7, tk=7, lengths=[7, 3, 5], causal=False),
    "cross_padding": dict(tq=4, tk=10, lengths=[10, 2, 6], causal=False),
    "causal": dict(tq=8, tk=8, lengths=None, causal=True),
    "causal_padding": dict(tq=8, tk=8, lengths=[8, 4, 6], causal=True),
}


@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(backend, case):
    c = CASES[case]
    b, h, d = 3, 4, 16
    q = torch.randn(b, c["tq"], h, d)
    k, v = torch.randn(b, c["tk"], h, d), torch.randn(b, c["tk"], h, d)
    mask = lengths_mask(c["lengths"], c["tk"]) if c["lengths"] else None
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


@pytest.mark.parametrize("case", ["cross_tq_ne_tk", "cross_padding", "padding", "self"])
def test_sdpa_short_query_path_matches_reference(case):
    """Decode-time cross-attention: head-major K/V, no autograd -> sdpa's matmul path."""
    from litmt.attention import sdpa

    c = CASES[case]
    b, h, d = 3, 4, 16
    q = torch.randn(b, c["tq"], h, d)
    k, v = (torch.randn(b, h, c["tk"], d).transpose(1, 2) for _ in range(2))  # head-major
    mask = lengths_mask(c["lengths"], c["tk"]) if c["lengths"] else None
    if mask is not None:
        mask[-1] = True  # plus a fully padded row
    kernel = build_backend("sdpa")
    with torch.no_grad():
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        assert sdpa._short_query_block(qh, kh, vh, causal=False, dropout_p=0.0)
        out = kernel(q, k, v, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    ref = reference(q, k, v, mask)
    if mask is not None:  # a fully padded row attends to all keys (safe_padding_mask)
        ref[-1] = reference(q[-1:], k[-1:], v[-1:])[0]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # with autograd, or keys laid out (B, T, H, D), the fused kernel runs instead
    assert not sdpa._short_query_block(qh.requires_grad_(), kh, vh, False, 0.0)
    token_major = torch.randn(b, c["tk"], h, d).transpose(1, 2)  # (B, H, T, D) view
    assert not sdpa._short_query_block(qh.detach(), token_major, token_major, False, 0.0)


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


def test_support_declarations_and_build_time_validation():
    assert backend_support("math").weights and not backend_support("sdpa").weights
    with pytest.raises(BackendError, match="cannot return attention weights; use 'math'"):
        build_backend("sdpa").validate(AttentionRequest(need_weights=True, site="cross"))
    with pytest.raises(BackendError, match="takes no options"):
        build_backend("sdpa", window=3)


def test_dropout_is_applied_only_when_asked():
    q = k = v = torch.randn(2, 6, 2, 8)
    for backend in EXACT:
        kern = build_backend(backend)
        a = kern(q, k, v, dropout_p=0.0)
        torch.testing.assert_close(a, kern(q, k, v, dropout_p=0.0))
        assert not torch.allclose(a, kern(q, k, v, dropout_p=0.5))
