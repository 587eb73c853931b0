"""CPU tests of the optional backends: parity, patterns, decode steps, errors, learning.

Exact backends (sdpa, flex, auto) are compared with `math`, which test_contract.py checks
against a hand-written reference. Approximate backends are exact where they should be
(local with window >= T, sparse with a covering layout) and otherwise compared with dense
references written here from their definitions (band mask, block layout, naive O(T²) linear
attention).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from litmt.attention import build_backend, list_backends
from litmt.attention.base import AttentionRequest
from litmt.attention.linear_attention import feature_map
from litmt.attention.sparse import block_layout
from litmt.attention.te import fp8_autocast
from litmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.errors import BackendError
from litmt.models.config import AttentionConfig, TransformerConfig
from litmt.models.transformer import Seq2SeqTransformer

CONF = Path(__file__).resolve().parents[2] / "conf"

CASES = {
    "self": dict(tq=9, tk=9, lengths=None, causal=False),
    "cross": dict(tq=5, tk=11, lengths=None, causal=False),
    "padding": dict(tq=7, tk=7, lengths=[7, 3, 5], causal=False),
    "cross_padding": dict(tq=4, tk=10, lengths=[10, 2, 6], causal=False),
    "causal": dict(tq=8, tk=8, lengths=None, causal=True),
    "causal_padding": dict(tq=8, tk=8, lengths=[8, 4, 6], causal=True),
    "decode_step": dict(tq=1, tk=12, lengths=None, causal=False),
    "decode_chunk": dict(tq=3, tk=12, lengths=None, causal=True),
}


def make_inputs(case: dict, b: int = 3, h: int = 2, d: int = 16):
    q = torch.randn(b, case["tq"], h, d)
    k, v = torch.randn(b, case["tk"], h, d), torch.randn(b, case["tk"], h, d)
    mask = None
    if case["lengths"]:
        lengths = torch.tensor(case["lengths"])
        mask = torch.arange(case["tk"])[None, :] >= lengths[:, None]  # (B, Tk) True = pad
    return q, k, v, mask


def dense_reference(q, k, v, allowed):
    """softmax(QKᵀ/√D) V in float64 with `allowed` (B|1, 1, Tq, Tk) bool; (B, Tq, H, D)."""
    q, k, v = (t.permute(0, 2, 1, 3).double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).float()


def positions_mask(tq, tk, key_padding_mask, causal, extra=None):
    """(B|1, 1, Tq, Tk) allowed-mask over absolute positions (query i at Tk - Tq + i)."""
    qpos = torch.arange(tq)[:, None] + (tk - tq)
    kpos = torch.arange(tk)[None, :]
    allowed = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        allowed &= kpos <= qpos
    if extra is not None:
        allowed &= extra(qpos, kpos)
    allowed = allowed[None, None]
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    return allowed


def real_rows(case, mask):
    """(B, Tq) bool: query rows that are not padding (padded rows' outputs are arbitrary)."""
    b = 3
    if mask is None or case["tq"] != case["tk"]:
        return torch.ones(b, case["tq"], dtype=torch.bool)
    return ~mask


# -- exact backends against math -------------------------------------------------------
EXACT_CPU = {
    "sdpa": {},
    "flex": {"compile": False},
    "auto": {},
}


@pytest.mark.parametrize("backend", list(EXACT_CPU))
@pytest.mark.parametrize("case", list(CASES))
def test_exact_backends_match_math(backend, case):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    kernel = build_backend(backend, **EXACT_CPU[backend])
    out = kernel(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    assert out.shape == (3, c["tq"], 2, 16)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["padding", "causal"])
def test_compiled_flex_matches_math(case):
    """The compiled (inductor, C++) flex kernel on CPU; compiling takes ~10-20 s per shape."""
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    out = build_backend("flex")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_flex_trains_on_cpu_through_the_dense_fallback():
    """torch has no CPU backward for flex; the same mask then goes through sdpa."""
    q, k, v, mask = make_inputs(CASES["causal_padding"])
    q.requires_grad_(True)
    out = build_backend("flex", window=3)(q, k, v, key_padding_mask=mask, causal=True)
    out.sum().backward()
    allowed = positions_mask(8, 8, mask, True, lambda i, j: (i - j).abs() <= 3)
    q2 = q.detach().requires_grad_(True)
    ref = dense_reference(q2, k, v, allowed)
    ref.sum().backward()
    rows = real_rows(CASES["causal_padding"], mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q.grad[rows], q2.grad[rows].float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("options", "extra"),
    [
        ({"window": 2}, lambda i, j: (i - j).abs() <= 2),
        (
            {"sparse": "strided", "sparse_block_size": 2, "sparse_stride": 2},
            lambda i, j: block_layout(torch.arange(8), 8, mode="strided", stride=2, causal=False)[
                i // 2, j // 2
            ],
        ),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_flex_patterns_match_dense_masks(options, extra, causal):
    q, k, v, mask = make_inputs(CASES["padding"])
    out = build_backend("flex", compile=False, **options)(
        q, k, v, key_padding_mask=mask, causal=causal
    )
    ref = dense_reference(q, k, v, positions_mask(7, 7, mask, causal, extra))
    rows = real_rows(CASES["padding"], mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


# -- local ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("cross")])
def test_local_with_window_covering_the_sequence_is_exact(case):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    out = build_backend("local", window=c["tk"])(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("cross")])
@pytest.mark.parametrize(("window", "chunk"), [(0, None), (2, None), (3, 2), (2, 5)])
def test_local_matches_a_dense_band_mask(case, window, chunk):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    kernel = build_backend("local", window=window, chunk_size=chunk)
    out = kernel(q, k, v, key_padding_mask=mask, causal=c["causal"])
    band = positions_mask(c["tq"], c["tk"], mask, c["causal"], lambda i, j: (i - j).abs() <= window)
    ref = dense_reference(q, k, v, band)
    rows = real_rows(c, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


def test_local_never_builds_a_full_length_mask(monkeypatch):
    """Each chunk attends C + 2w keys whatever T is: the cost is O(T·w), not O(T²)."""
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append((tuple(k.shape), tuple(attn_mask.shape)))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr("litmt.attention.local.F.scaled_dot_product_attention", spy)
    t, w = 1024, 8
    q = k = v = torch.randn(1, t, 2, 8)
    build_backend("local", window=w, chunk_size=16)(q, k, v, causal=False)
    build_backend("local", window=w, chunk_size=16)(q, k, v, causal=True)
    assert seen[0] == ((t // 16, 2, 16 + 2 * w, 8), (t // 16, 1, 16, 16 + 2 * w))
    assert seen[1] == ((t // 16, 2, 16 + w, 8), (t // 16, 1, 16, 16 + w))


# -- sparse -----------------------------------------------------------------------------
def test_sparse_layouts_follow_child_et_al():
    fixed = block_layout(torch.arange(6), 6, mode="fixed", stride=3)
    expected_fixed = torch.tensor(
        [
            [1, 1, 1, 0, 0, 1],  # own group {0,1,2} + summary blocks {2, 5}
            [1, 1, 1, 0, 0, 1],
            [1, 1, 1, 0, 0, 1],
            [0, 0, 1, 1, 1, 1],
            [0, 0, 1, 1, 1, 1],
            [0, 0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(fixed, expected_fixed)
    strided = block_layout(torch.arange(6), 6, mode="strided", stride=2, causal=True)
    expected_strided = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],  # neighbour 1 and every 2nd block back: 0, 2
            [0, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 0],
            [0, 1, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(strided, expected_strided)


@pytest.mark.parametrize("mode", ["fixed", "strided"])
@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("cross")])
def test_sparse_with_a_covering_layout_is_exact(mode, case):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    kernel = build_backend("sparse", mode=mode, block_size=2, stride=64)  # stride >= blocks
    out = kernel(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["fixed", "strided"])
@pytest.mark.parametrize("case", ["padding", "causal_padding", "decode_step", "decode_chunk"])
def test_sparse_matches_its_dense_layout(mode, case):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    p, s = 2, 2
    layout = block_layout(torch.arange(8), 8, mode=mode, stride=s, causal=c["causal"])
    allowed = positions_mask(
        c["tq"], c["tk"], mask, c["causal"], lambda i, j: layout[i // p, j // p]
    )
    out = build_backend("sparse", mode=mode, block_size=p, stride=s)(
        q, k, v, key_padding_mask=mask, causal=c["causal"]
    )
    ref = dense_reference(q, k, v, allowed)
    rows = real_rows(c, mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


# -- linear -----------------------------------------------------------------------------
def naive_linear(q, k, v, key_padding_mask=None, causal=False, eps=1e-6):
    """out_i = Σ_j s_ij v_j / (Σ_j s_ij + eps), s_ij = φ(q_i)·φ(k_j) over allowed j; O(T²)."""
    q, k, v = (t.double() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", feature_map(q), feature_map(k))  # (B, H, Tq, Tk)
    s = s * positions_mask(q.size(1), k.size(1), key_padding_mask, causal)
    out = torch.einsum("bhqk,bkhd->bqhd", s, v) / (s.sum(-1).transpose(1, 2)[..., None] + eps)
    return out.float()


@pytest.mark.parametrize("chunk", [3, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_linear_matches_its_naive_quadratic_formula(case, chunk):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    out = build_backend("linear", chunk_size=chunk)(
        q, k, v, key_padding_mask=mask, causal=c["causal"]
    )
    torch.testing.assert_close(out, naive_linear(q, k, v, mask, c["causal"]), atol=1e-5, rtol=1e-5)


# -- decoding: one step against a KV cache equals the row of the full pass -----------------
@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("local", {"window": 3}),
        ("sparse", {"mode": "fixed", "block_size": 2, "stride": 2}),
        ("sparse", {"mode": "strided", "block_size": 2, "stride": 2}),
        ("linear", {}),
        ("flex", {"window": 3, "compile": False}),
    ],
)
def test_decode_steps_match_the_full_causal_pass(backend, options):
    q, k, v = (torch.randn(2, 10, 2, 8) for _ in range(3))
    kernel = build_backend(backend, **options)
    full = kernel(q, k, v, causal=True)
    for t in range(10):  # what MultiHeadAttention does with a cache: causal=False, Tq=1
        step = kernel(q[:, t : t + 1], k[:, : t + 1], v[:, : t + 1], causal=False)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


# -- build-time errors ------------------------------------------------------------------
def tiny_config(**attention) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=16,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
        attention=AttentionConfig(**attention),
    )


@pytest.mark.parametrize(
    ("backend", "package", "extra"),
    [
        ("flash", "flash_attn", "flash"),
        ("xformers", "xformers", "xformers"),
        ("te", "transformer_engine", "te"),
    ],
)
def test_cuda_only_backends_fail_at_build_time_on_cpu(backend, package, extra):
    cfg = dict(encoder_self=backend, decoder_self=backend, cross=backend)
    if importlib.util.find_spec(package) is None:
        with pytest.raises(
            BackendError,
            match=rf"needs the '{package}.*install it with pip install 'litmt\[{extra}\]'",
        ):
            Seq2SeqTransformer(tiny_config(**cfg))
        return
    model = Seq2SeqTransformer(tiny_config(**cfg))  # pragma: no cover - package installed
    with pytest.raises(BackendError, match=rf"'{backend}' \(at encoder_self\) runs only on cuda"):
        model.validate_backends("cpu")


@pytest.mark.parametrize("backend", ["linear", "flex"])
def test_backends_without_dropout_refuse_attention_dropout(backend):
    cfg = tiny_config(encoder_self=backend)
    cfg.attention_dropout = 0.1
    model = Seq2SeqTransformer(cfg)
    model.validate_backends("cpu", training=False)  # no dropout at inference
    with pytest.raises(
        BackendError, match=rf"'{backend}' \(at encoder_self\) does not support attention dropout"
    ):
        model.validate_backends("cpu", training=True)


@pytest.mark.parametrize(
    ("backend", "options"), [("local", {}), ("sparse", {}), ("flex", {"window": 4})]
)
def test_positional_patterns_are_refused_across_sequences(backend, options):
    model = Seq2SeqTransformer(tiny_config(cross=backend, cross_options=options))
    with pytest.raises(BackendError, match=rf"'{backend}' \(at cross\).*model.attention.cross"):
        model.validate_backends("cpu")


@pytest.mark.parametrize(
    ("backend", "options", "message"),
    [
        ("local", {"window": -1}, "option window must be an integer >= 0, got -1"),
        ("local", {"window": 4, "size": 2}, r"no option\(s\) \['size'\]; valid options: window"),
        ("sparse", {"mode": "dense"}, "unknown mode 'dense'; valid modes: fixed, strided"),
        ("sparse", {"stride": 2, "summary": 3}, "summary=3 must not exceed stride=2"),
        ("flex", {"sparse": "random"}, "unknown sparse mode 'random'"),
        ("linear", {"chunk_size": 0}, "option chunk_size must be an integer >= 1"),
    ],
)
def test_bad_options_raise_clear_errors(backend, options, message):
    with pytest.raises(BackendError, match=message):
        build_backend(backend, **options)


def test_approximate_backends_declare_it():
    assert not build_backend("local").support.exact
    assert not build_backend("linear").support.exact
    assert not build_backend("sparse").support.exact
    assert build_backend("flex").support.exact
    assert not build_backend("flex", window=4).support.exact


def test_auto_picks_sdpa_on_cpu_and_logs_it(caplog):
    kernel = build_backend("auto")
    with caplog.at_level(logging.INFO, logger="litmt.attention.auto"):
        kernel.validate(AttentionRequest(device="cpu", dtype=torch.float32, site="encoder_self"))
    assert "attention=auto at encoder_self: using 'sdpa' on cpu (float32)" in caplog.text


def test_fp8_autocast_is_a_no_op_when_disabled_and_explains_itself_otherwise():
    with fp8_autocast(enabled=False):
        pass
    with pytest.raises(BackendError, match="unknown FP8 format 'E5M3'"):
        fp8_autocast(enabled=True, fp8_format="E5M3")
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(BackendError, match=r"pip install 'litmt\[te\]'"):
            fp8_autocast(enabled=True)


# -- config groups ----------------------------------------------------------------------
@pytest.mark.parametrize("group", sorted(p.stem for p in (CONF / "attention").glob("*.yaml")))
def test_every_attention_group_composes_and_builds(group):
    hydra = pytest.importorskip("hydra")
    from omegaconf import OmegaConf

    overrides = [f"attention={group}"]
    if group == "local":
        overrides.append("model.attention.encoder_self_options.window=64")
    with hydra.initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra.compose("train", overrides=overrides)
    attention = OmegaConf.to_container(cfg.model.attention)
    assert {attention[s] for s in ("encoder_self", "decoder_self", "cross")} <= set(list_backends())
    if group == "local":
        assert attention["encoder_self_options"]["window"] == 64
    try:
        model = Seq2SeqTransformer(tiny_config(**attention))
    except BackendError as err:  # optional package missing: the message names the extra
        assert "pip install 'litmt[" in str(err)
        return
    model.validate_backends("cpu" if group not in ("flash", "xformers", "te") else "cuda")


# -- learning ---------------------------------------------------------------------------
def reverse_batch(generator: torch.Generator, batch: int = 32, vocab: int = 12):
    """Random sequences (ids 4..V-1) of length 3..8; the target is the sequence reversed."""
    lengths = torch.randint(3, 9, (batch,), generator=generator)
    src = torch.full((batch, 9), PAD_ID)
    tgt_in = torch.full((batch, 10), PAD_ID)
    tgt_out = torch.full((batch, 10), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(4, vocab, (n,), generator=generator)
        src[i, :n], src[i, n] = seq, EOS_ID
        tgt_in[i, 0], tgt_in[i, 1 : n + 1] = BOS_ID, seq.flip(0)
        tgt_out[i, :n], tgt_out[i, n] = seq.flip(0), EOS_ID
    return src, tgt_in, tgt_out


@pytest.mark.parametrize(("backend", "options"), [("local", {"window": 2}), ("linear", {})])
def test_tiny_model_with_approximate_encoder_attention_learns_to_reverse(backend, options):
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=12,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=1,
        dropout=0.0,
        max_positions=16,
        attention=AttentionConfig(encoder_self=backend, encoder_self_options=options),
    )
    model = Seq2SeqTransformer(cfg)
    model.validate_backends("cpu", torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(250):
        src, tgt_in, tgt_out = reverse_batch(gen)
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    start, end = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert end < 0.25 * start, f"{backend}: loss {start:.3f} -> {end:.3f}"


# -- edge cases -------------------------------------------------------------------------
COVERING = {
    "sdpa": {},
    "flex": {"compile": False},
    "local": {"window": 64},
    "sparse": {"block_size": 2, "stride": 64},
    "linear": {},
}


@pytest.mark.parametrize("backend", list(COVERING))
@pytest.mark.parametrize("causal", [False, True])
def test_fully_padded_rows_stay_finite(backend, causal):
    q, k, v = (torch.randn(2, 4, 2, 8) for _ in range(3))
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    kernel = build_backend(backend, **COVERING[backend])
    out = kernel(q, k, v, key_padding_mask=mask, causal=causal)
    assert torch.isfinite(out).all()
    ref = (
        naive_linear(q, k, v, mask, causal)
        if backend == "linear"
        else build_backend("math")(q, k, v, key_padding_mask=mask, causal=causal)
    )
    torch.testing.assert_close(out[0, :2], ref[0, :2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["local", "sparse", "linear"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_on_cpu(backend, dtype):
    q, k, v, mask = make_inputs(CASES["causal_padding"])
    kernel = build_backend(backend, **COVERING[backend])
    out = kernel(*(t.to(dtype) for t in (q, k, v)), key_padding_mask=mask, causal=True)
    ref = kernel(q, k, v, key_padding_mask=mask, causal=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


# -- flash / xformers plumbing on CPU, against stand-ins of their packages ---------------------
# The real kernels run only on CUDA (test_gpu_backends.py). These stand-ins implement the
# documented semantics of the package functions with plain attention, so the packing
# (cu_seqlens, block-diagonal biases, index bookkeeping) of our wrappers is checked here.
def _attend(q, k, v, allowed):
    """q (B, Tq, H, D), k/v (B, Tk, H, D), allowed (Tq, Tk) bool -> (B, Tq, H, D)."""
    return dense_reference(q, k, v, allowed[None, None]).to(q.dtype)


def _bottom_right(tq, tk):
    return torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)


def fake_flash_attn():
    mod = types.ModuleType("flash_attn")

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        tq, tk = q.size(1), k.size(1)
        allowed = _bottom_right(tq, tk) if causal else torch.ones(tq, tk, dtype=torch.bool)
        return _attend(q, k, v, allowed)

    def flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False
    ):
        assert cu_q.dtype == cu_k.dtype == torch.int32 and len(cu_q) == len(cu_k)
        outs = []
        for i in range(len(cu_q) - 1):
            qs, ks, vs = (
                q[cu_q[i] : cu_q[i + 1]],
                k[cu_k[i] : cu_k[i + 1]],
                v[cu_k[i] : cu_k[i + 1]],
            )
            assert qs.size(0) <= max_q and ks.size(0) <= max_k
            outs.append(flash_attn_func(qs[None], ks[None], vs[None], causal=causal)[0])
        return torch.cat(outs)

    mod.flash_attn_func, mod.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    return mod


def fake_xformers():
    """xformers, xformers.ops, xformers.ops.fmha.attn_bias with the biases we use."""

    class LowerTriangularMask:  # top-left aligned
        def allowed(self, tq, tk):
            return torch.ones(tq, tk, dtype=torch.bool).tril()

    class LowerTriangularFromBottomRightMask:
        def allowed(self, tq, tk):
            return _bottom_right(tq, tk)

    class BlockDiagonalMask:
        causal = False

        def __init__(self, q_seqlen, kv_seqlen):
            self.q_seqlen, self.kv_seqlen = list(q_seqlen), list(kv_seqlen)

        @classmethod
        def from_seqlens(cls, q_seqlen, kv_seqlen=None):
            return cls(q_seqlen, q_seqlen if kv_seqlen is None else kv_seqlen)

        def allowed(self, tq, tk):
            assert (tq, tk) == (sum(self.q_seqlen), sum(self.kv_seqlen))
            out = torch.zeros(tq, tk, dtype=torch.bool)
            q0 = k0 = 0
            for nq, nk in zip(self.q_seqlen, self.kv_seqlen, strict=True):
                block = torch.ones(nq, nk, dtype=torch.bool)
                out[q0 : q0 + nq, k0 : k0 + nk] = block.tril() if self.causal else block
                q0, k0 = q0 + nq, k0 + nk
            return out

    class BlockDiagonalCausalMask(BlockDiagonalMask):  # top-left aligned inside each block
        causal = True

    bias = types.ModuleType("xformers.ops.fmha.attn_bias")
    for cls in (
        LowerTriangularMask,
        LowerTriangularFromBottomRightMask,
        BlockDiagonalMask,
        BlockDiagonalCausalMask,
    ):
        setattr(bias, cls.__name__, cls)

    def memory_efficient_attention(q, k, v, attn_bias=None, p=0.0):
        tq, tk = q.size(1), k.size(1)
        if attn_bias is not None and isinstance(attn_bias, BlockDiagonalMask):
            assert q.size(0) == 1, "block-diagonal biases need the batch packed into B=1"
        allowed = (
            torch.ones(tq, tk, dtype=torch.bool) if attn_bias is None else attn_bias.allowed(tq, tk)
        )
        return _attend(q, k, v, allowed)

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = memory_efficient_attention
    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.attn_bias, ops.fmha = bias, fmha
    root = types.ModuleType("xformers")
    root.ops = ops
    return {
        "xformers": root,
        "xformers.ops": ops,
        "xformers.ops.fmha": fmha,
        "xformers.ops.fmha.attn_bias": bias,
    }


@pytest.mark.parametrize("backend", ["flash", "xformers"])
@pytest.mark.parametrize("case", list(CASES))
def test_packing_of_flash_and_xformers_wrappers(backend, case, monkeypatch):
    from litmt.attention.flash import FlashAttention
    from litmt.attention.xformers_backend import XFormersAttention

    modules = {"flash_attn": fake_flash_attn()} if backend == "flash" else fake_xformers()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    cls = FlashAttention if backend == "flash" else XFormersAttention
    monkeypatch.setattr(cls, "check_inputs", lambda self, q: None)  # let CPU tensors through
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    out = build_backend(backend)(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    rows = real_rows(c, mask)
    assert out.shape == ref.shape
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)
    if c["causal"] and mask is not None:  # packed causal path: padded query rows are 0
        assert out[~rows].abs().max() == 0


def fake_transformer_engine(calls: list):
    """transformer_engine.pytorch.DotProductAttention with TE's documented mask semantics."""

    class DotProductAttention(torch.nn.Module):
        def __init__(
            self,
            num_attention_heads,
            kv_channels,
            attention_dropout=0.0,
            qkv_format="sbhd",
            attn_mask_type="causal",
            attention_type="self",
        ):
            super().__init__()
            assert qkv_format == "bshd" and attn_mask_type == "no_mask"  # set explicitly
            self.h, self.d, self.attention_type = num_attention_heads, kv_channels, attention_type

        def forward(self, q, k, v, attention_mask=None, attn_mask_type=None):
            calls.append((self.attention_type, attn_mask_type))
            b, tq, h, d = q.shape
            tk = k.size(1)
            assert (h, d) == (self.h, self.d)
            q_pad = torch.zeros(b, tq, dtype=torch.bool)
            kv_pad = torch.zeros(b, tk, dtype=torch.bool)
            if "padding" in attn_mask_type:
                if self.attention_type == "self":
                    q_pad = kv_pad = attention_mask[:, 0, 0, :]  # one mask, shape (B, 1, 1, S)
                else:
                    q_pad, kv_pad = (m[:, 0, 0, :] for m in attention_mask)
            allowed = torch.ones(tq, tk, dtype=torch.bool)
            if "causal" in attn_mask_type:
                bottom_right = attn_mask_type.endswith("bottom_right")
                allowed = allowed.tril(tk - tq if bottom_right else 0)
            allowed = allowed[None, None] & ~kv_pad[:, None, None, :]  # (B, 1, Tq, Tk)
            out = dense_reference(q, k, v, allowed | ~allowed.any(-1, keepdim=True))
            out = out.masked_fill(q_pad[:, :, None, None], 0.0)  # padded queries: 0
            return out.reshape(b, tq, h * d)  # TE returns (B, T, H*D) for bshd

    te = types.ModuleType("transformer_engine.pytorch")
    te.DotProductAttention = DotProductAttention
    root = types.ModuleType("transformer_engine")
    root.pytorch = te
    return {"transformer_engine": root, "transformer_engine.pytorch": te}


TE_MASK_TYPES = {
    "self": ("self", "no_mask"),
    "cross": ("cross", "no_mask"),
    "padding": ("self", "padding"),
    "cross_padding": ("cross", "padding"),
    "causal": ("self", "causal"),
    "causal_padding": ("self", "padding_causal"),
    "decode_step": ("cross", "no_mask"),
    "decode_chunk": ("cross", "causal_bottom_right"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_te_wrapper_sets_layout_and_mask_type_per_site(case, monkeypatch):
    from litmt.attention.te import TEAttention

    calls: list = []
    for name, module in fake_transformer_engine(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(TEAttention, "check_inputs", lambda self, q: None)
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    out = build_backend("te")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    assert calls == [TE_MASK_TYPES[case]]
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    rows = real_rows(c, mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


# -- benchmark script -------------------------------------------------------------------
def test_benchmark_script_smoke():
    """One tiny cell end to end: subprocess worker, table, claims section (prints only)."""
    import subprocess

    script = CONF.parent / "scripts" / "benchmark_attention.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--backends",
            "linear",
            "math",
            "--lengths",
            "64",
            "--causal",
            "true",
            "--heads",
            "2",
            "--dim",
            "8",
            "--out",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "**causal, forward+backward time (ms)**" in proc.stdout
    assert "| linear |" in proc.stdout and "| math |" in proc.stdout
    assert "linear >= 10x faster than sdpa at L=32768: not measured" in proc.stdout
