"""CPU tests of the optional backends: parity, patterns, decode steps, errors, learning.

Exact backends (sdpa, flex, auto) are compared with `math`, which test_contract.py checks
against a hand-written reference. Approximate backends are exact where they should be
(local with window >= T, sparse with a covering layout) and otherwise compared with dense
references written here from their definitions (band mask, block layout, naive O(T²) linear
attention).
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import pytest
import tiny_model
import torch
import torch.nn.functional as F
from attention_cases import CASES, make_inputs
from emulations import allow_cpu_fp32
from emulations import flash_attn as flash_emulation
from emulations import transformer_engine as te_emulation
from emulations import xformers as xformers_emulation

from litmt.attention import build_backend, get_backend_class, list_backends
from litmt.attention.backends import flex_compile
from litmt.attention.backends.linear import feature_map
from litmt.attention.backends.sparse import block_layout
from litmt.attention.backends.te import fp8_autocast
from litmt.attention.base import AttentionRequest
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.errors import BackendError
from litmt.models.config import AttentionConfig, TransformerConfig
from litmt.models.transformer import Seq2SeqTransformer

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

CONF = Path(__file__).resolve().parents[3] / "conf"
EMULATIONS = {"flash": flash_emulation, "xformers": xformers_emulation, "te": te_emulation}


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
def test_compiled_flex_matches_math(case, monkeypatch):
    """The compiled (inductor, C++) flex kernel on CPU; compiling takes ~10-20 s per shape."""
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    fresh_compile_state(monkeypatch)
    out = build_backend("flex")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    require_compiled_flex()  # never eager flex compared with math unseen
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options", [{}, {"window": 2}, {"sparse": "strided", "sparse_block_size": 4}]
)
def test_flex_mask_mod_masks_indices_past_the_lengths(options):
    """flex may call mask_mod past the call's lengths (pytorch#137801; inductor's CPU kernel does
    under ATEN_CPU_CAPABILITY=avx2): those positions are masked, never an index error."""
    kernel = build_backend("flex", **options)
    tq = tk = 8
    valid = torch.ones(2, tk, dtype=torch.bool)  # (B, Tk)
    q_valid = torch.ones(tq, dtype=torch.bool)  # (Tq,)
    mask_mod = kernel.mask_mod(tq, tk, torch.tensor(False), valid, "cpu", q_valid)
    b, h = torch.tensor([1, 1, 1, 1]), torch.tensor([0, 0, 0, 0])
    q_idx, kv_idx = torch.tensor([3, 3, tq, tq + 5]), torch.tensor([3, tk + 7, 3, tk])
    assert mask_mod(b, h, q_idx, kv_idx).tolist() == [True, False, False, False]


# The only reasons compiled flex may fall back in a test: a machine that cannot build the
# kernel. torch/_inductor/exc.py: InvalidCxxCompiler (no C++ compiler), TritonMissing,
# GPUTooOldForTriton; torch/_inductor/kernel/flex/flex_cpu.py (`check_cpu_supported`): "torch.compile
# on current platform is not supported for CPU" (no vectorised ISA, e.g. ATEN_CPU_CAPABILITY=default).
MISSING_TOOLCHAIN = (
    "InvalidCxxCompiler",
    "TritonMissing",
    "GPUTooOldForTriton",
    "torch.compile on current platform is not supported for CPU",
)


def require_compiled_flex() -> None:
    """After compiled flex ran: skip where the machine cannot build the kernel (a missing
    toolchain, `MISSING_TOOLCHAIN`); fail on any other fallback to eager flex, so a regression
    in the lowering of litmt's mask cannot turn a compiled test into a skip or an eager pass."""
    from litmt.attention.backends import flex

    why = flex.compile_fallback()
    if why is None:
        return
    if any(reason in why for reason in MISSING_TOOLCHAIN):
        pytest.skip(f"torch.compile cannot build flex on this machine: {why}")
    pytest.fail(f"compiled flex fell back to eager flex: {why}")


def test_a_lowering_failure_fails_the_compiled_tests(monkeypatch) -> None:
    """The rule above bites: a fallback for any other reason is a failure, not a skip."""
    monkeypatch.setitem(flex_compile.STATE, "why", "InductorError: LoweringException: mask_mod")
    with pytest.raises(pytest.fail.Exception, match="fell back to eager flex"):
        require_compiled_flex()
    monkeypatch.setitem(flex_compile.STATE, "why", "InvalidCxxCompiler: no working C++ compiler")
    with pytest.raises(pytest.skip.Exception):
        require_compiled_flex()


def fresh_compile_state(monkeypatch: pytest.MonkeyPatch, fn=None) -> None:
    """A process that has compiled nothing and never fell back (restored after the test)."""
    for key, value in (("fn", fn), ("why", None), ("buckets", set()), ("capped", False)):
        monkeypatch.setitem(flex_compile.STATE, key, value)


def test_compiled_flex_compiles_a_bounded_number_of_times(monkeypatch):
    """21 distinct (B, T) batch shapes with padding compile exactly 2 kernels (B buckets 2
    and 4, T bucket 128), not one per shape: the old per-shape compile passed dynamo's
    recompile limit (8) and silently ran eager flex. Each output still equals `math`."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fresh_compile_state(monkeypatch)
    kernel, reference = build_backend("flex"), build_backend("math")
    gen = torch.Generator().manual_seed(0)
    shapes = [(b, t) for b in (2, 3, 4) for t in (5, 17, 33, 64, 90, 111, 128)]
    for b, t in shapes:
        q, k, v = (torch.randn(b, t, 2, 8, generator=gen) for _ in range(3))
        lengths = torch.randint(1, t + 1, (b,), generator=gen)
        mask = torch.arange(t)[None, :] >= lengths[:, None]  # (B, T) True = pad
        out = kernel(q, k, v, key_padding_mask=mask)
        require_compiled_flex()
        rows = ~mask
        ref = reference(q, k, v, key_padding_mask=mask)
        torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)
    assert len(set(shapes)) == 21
    assert counters["stats"]["unique_graphs"] == 2
    assert len(flex_compile.STATE["buckets"]) == 2


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_builds_one_block_mask_per_forward_shared_by_the_layers(monkeypatch, compiled):
    """Every encoder layer gets the same padding mask: its BlockMask is built once per
    forward, not once per layer; a new batch (a new mask) builds a new one, and the output
    still equals the same model on `math`."""
    from litmt.attention.backends import flex
    from litmt.models import Seq2SeqTransformer

    if compiled:
        torch._dynamo.reset()
        fresh_compile_state(monkeypatch)
    module = flex._flex_module()
    built = []
    original = module.create_block_mask

    def counting(*args, **kwargs):
        built.append(args[3:5])  # (Q_LEN, KV_LEN)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "create_block_mask", counting)
    attention = {"encoder_self": "flex", "encoder_self_options": {"compile": compiled}}
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_model.tiny_config(n_encoder_layers=3, attention=attention))
    reference = Seq2SeqTransformer(tiny_model.tiny_config(n_encoder_layers=3))
    reference.load_state_dict(model.state_dict())
    model.eval(), reference.eval()
    for step, lengths in enumerate(([9, 4, 7], [3, 9, 9])):
        src = torch.randint(4, 60, (3, 9))
        for i, n in enumerate(lengths):
            src[i, n:] = PAD_ID
        with torch.no_grad():
            memory, mask = model.encode(src)
            if compiled:
                require_compiled_flex()
            want, _ = reference.encode(src)
        assert len(built) == step + 1, f"{len(built)} block masks after {step + 1} forwards"
        torch.testing.assert_close(memory[~mask], want[~mask], atol=1e-5, rtol=1e-5)


def _cannot_compile() -> Exception:
    from torch._inductor.exc import InvalidCxxCompiler

    return InvalidCxxCompiler()


def _oom_inside_the_compiler() -> Exception:
    from torch._dynamo.exc import BackendCompilerFailed

    return BackendCompilerFailed("inductor", torch.OutOfMemoryError("CUDA out of memory"), None)


@pytest.mark.parametrize(
    ("error", "falls_back"),
    [
        (_cannot_compile, True),
        (lambda: torch.OutOfMemoryError("CUDA out of memory"), False),
        (_oom_inside_the_compiler, False),
        (lambda: RuntimeError("a bug in our mask"), False),
    ],
    ids=["no-compiler", "oom", "oom-while-compiling", "other-error"],
)
def test_flex_falls_back_to_eager_only_when_it_cannot_compile(
    error, falls_back, monkeypatch, caplog
):
    from litmt.attention.backends import flex

    def compiled(*args, **kwargs):
        raise error()

    fresh_compile_state(monkeypatch, fn=compiled)
    q, k, v, mask = make_inputs(CASES["padding"])
    kernel = build_backend("flex")
    if not falls_back:
        with pytest.raises(type(error())):
            kernel(q, k, v, key_padding_mask=mask)
        assert not flex.compile_fallback()  # compilation stays on for the next batch
        return
    with caplog.at_level(logging.WARNING, logger="litmt.attention.backends.flex_compile"):
        out = kernel(q, k, v, key_padding_mask=mask)
    assert flex.compile_fallback().startswith("InvalidCxxCompiler: ")
    assert "torch.compile cannot build the kernel here (InvalidCxxCompiler" in caplog.text
    ref = build_backend("math")(q, k, v, key_padding_mask=mask)
    rows = real_rows(CASES["padding"], mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


def test_a_refused_torch_compile_is_a_visible_fallback_to_eager_flex(monkeypatch, caplog):
    """torch.compile refusing to build the kernel when asked runs eager flex, with one
    warning and `compile_fallback()` naming why: never a silent fallback."""
    from litmt.attention.backends import flex

    original = torch.compile

    def refuse(model=None, **kwargs):
        if kwargs.get("backend", "inductor") != "inductor":  # eager flex's own wrapper
            return original(model, **kwargs)
        raise RuntimeError("torch.compile is not supported on this platform")

    fresh_compile_state(monkeypatch)
    monkeypatch.setattr(torch, "compile", refuse)
    q, k, v, mask = make_inputs(CASES["padding"])
    kernel = build_backend("flex")
    assert flex.compile_fallback() is None
    with caplog.at_level(logging.WARNING, logger="litmt.attention.backends.flex_compile"):
        out = kernel(q, k, v, key_padding_mask=mask)
        kernel(q, k, v, key_padding_mask=mask)  # the second call does not try again
    why = "RuntimeError: torch.compile is not supported on this platform"
    assert flex.compile_fallback() == why
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"flex: torch.compile cannot build the kernel here ({why}); using eager flex from now on"
    ]
    ref = build_backend("math")(q, k, v, key_padding_mask=mask)
    rows = real_rows(CASES["padding"], mask)
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


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


# Block layouts written out by hand from the rules in Child et al. 2019 (as stated in
# litmt.attention.backends.sparse), stride S = 2, 6 blocks: expected values that do not come from
# the code's own `block_layout`.
# strided: |I - J| < 2 (neighbours) or I - J even (every 2nd block, both directions)
# fixed: same group {0,1} {2,3} {4,5}, or J a summary block (J mod 2 == 1, summary=1)
HAND_LAYOUTS = {
    "strided": torch.tensor(
        [
            [1, 1, 1, 0, 1, 0],
            [1, 1, 1, 1, 0, 1],
            [1, 1, 1, 1, 1, 0],
            [0, 1, 1, 1, 1, 1],
            [1, 0, 1, 1, 1, 1],
            [0, 1, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    ),
    "fixed": torch.tensor(
        [
            [1, 1, 0, 1, 0, 1],
            [1, 1, 0, 1, 0, 1],
            [0, 1, 1, 1, 0, 1],
            [0, 1, 1, 1, 0, 1],
            [0, 1, 0, 1, 1, 1],
            [0, 1, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    ),
}


@pytest.mark.parametrize(
    ("options", "extra"),
    [
        ({"window": 2}, lambda i, j: (i - j).abs() <= 2),
        (
            {"sparse": "strided", "sparse_block_size": 2, "sparse_stride": 2},
            lambda i, j: HAND_LAYOUTS["strided"][i // 2, j // 2],
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

    monkeypatch.setattr("litmt.attention.backends.local.F.scaled_dot_product_attention", spy)
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
def test_block_layout_equals_the_hand_written_one(mode):
    assert torch.equal(block_layout(torch.arange(6), 6, mode=mode, stride=2), HAND_LAYOUTS[mode])


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
def test_sparse_matches_a_hand_written_layout(mode, case):
    c = CASES[case]
    q, k, v, mask = make_inputs(c)
    p, s = 2, 2
    layout = HAND_LAYOUTS[mode]  # (6, 6) blocks of P = 2 tokens cover T <= 12
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
    """`tiny_model.tiny_config` with 16 tokens, one layer a side and these `AttentionConfig`
    fields."""
    return tiny_model.tiny_config(
        src_vocab_size=16,
        n_encoder_layers=1,
        n_decoder_layers=1,
        attention=AttentionConfig(**attention),
    )


@pytest.mark.parametrize(
    ("backend", "modules", "extra"),
    [
        ("flash", ["flash_attn"], "flash"),
        ("xformers", ["xformers"], "xformers"),
        ("te", ["transformer_engine", "transformer_engine.pytorch"], "te"),
    ],
)
def test_missing_package_fails_at_build_time_naming_the_extra(backend, modules, extra, monkeypatch):
    for name in modules:  # None in sys.modules: the import fails, installed or not
        monkeypatch.setitem(sys.modules, name, None)
    cfg = dict(encoder_self=backend, decoder_self=backend, cross=backend)
    with pytest.raises(
        BackendError,
        match=rf"needs the '{modules[-1]}'.*install it with pip install 'litmt\[{extra}\]'",
    ):
        Seq2SeqTransformer(tiny_config(**cfg))


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_cuda_only_backends_refuse_cpu_and_run_through_their_emulations(backend, monkeypatch):
    """With the library present (emulated): CPU is refused at validation and at the first
    batch; with the test-only relaxation the real forward pass runs and equals `math`."""
    EMULATIONS[backend].install(monkeypatch, allow_cpu_fp32=False)
    cfg = tiny_config(encoder_self=backend, decoder_self=backend, cross=backend)
    model = Seq2SeqTransformer(cfg).eval()
    with pytest.raises(BackendError, match=rf"'{backend}' \(at encoder_self\) runs only on cuda"):
        model.validate_backends("cpu")
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 9, 10, 11], [BOS_ID, 12, PAD_ID, PAD_ID]])
    with pytest.raises(BackendError, match=rf"attention backend '{backend}' needs cuda"):
        model(src, tgt_in)
    monkeypatch.setitem(EMULATIONS[backend].ALLOW_CPU_FP32, "on", True)  # test-only relaxation
    allow_cpu_fp32(monkeypatch, get_backend_class(backend))
    model.validate_backends("cpu", torch.float32)
    with torch.no_grad():
        logits = model(src, tgt_in)
        model.set_attention_backend("math")
        torch.testing.assert_close(logits, model(src, tgt_in), atol=1e-5, rtol=1e-5)


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
        (
            "flex",
            {"sparse": "fixed", "sparse_stride": 2, "sparse_summary": 3},
            "sparse_summary=3 must not exceed sparse_stride=2",
        ),
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


# (device, CUDA capability or None = no CUDA, dtype, installed packages) -> auto's choice.
# The rule, stated independently of auto.py: flash on a CUDA GPU of sm80+ with fp16/bf16
# inputs when flash-attn is installed; sdpa everywhere else.
AUTO_TABLE = [
    ("cpu", None, torch.float32, {"flash_attn"}, "sdpa"),
    ("cpu", (9, 0), torch.bfloat16, {"flash_attn"}, "sdpa"),  # CPU tensors on a GPU box
    ("cuda", None, torch.bfloat16, {"flash_attn"}, "sdpa"),  # asked for cuda, none here
    ("cuda", (8, 0), torch.bfloat16, {"flash_attn"}, "flash"),
    ("cuda", (9, 0), torch.float16, {"flash_attn"}, "flash"),
    ("cuda:1", (8, 6), torch.bfloat16, {"flash_attn"}, "flash"),
    ("cuda", (8, 0), torch.float32, {"flash_attn"}, "sdpa"),
    ("cuda", (7, 5), torch.float16, {"flash_attn"}, "sdpa"),  # Turing: no flash-attn 2
    ("cuda", (9, 0), torch.bfloat16, set(), "sdpa"),
    ("cuda", (9, 0), torch.bfloat16, {"xformers", "transformer_engine"}, "sdpa"),
]


@pytest.mark.parametrize(
    ("device", "capability", "dtype", "installed", "expected"),
    AUTO_TABLE,
    ids=[f"{r[0]}-{r[1]}-{str(r[2])[6:]}-{'+'.join(sorted(r[3])) or 'none'}" for r in AUTO_TABLE],
)
def test_auto_choice_table(device, capability, dtype, installed, expected, monkeypatch):
    from litmt.attention.backends import auto

    problem = None if "flash_attn" in installed else ("not installed", "flash_attn")
    monkeypatch.setattr(auto.FlashAttention, "unavailable", classmethod(lambda cls: problem))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert auto.choose_backend(device, dtype) == expected


def test_auto_skips_an_installed_but_unusable_flash_attn(monkeypatch, caplog):
    """A flash_attn that imports without what flash calls (e.g. no FA2) is never chosen."""
    from litmt.attention.backends import auto

    why = "flash_attn.flash_attn_func: AttributeError: no such name"
    monkeypatch.setattr(
        auto.FlashAttention, "unavailable", classmethod(lambda cls: ("not usable", why))
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with caplog.at_level(logging.WARNING, logger="litmt.attention.backends.auto"):
        assert auto.choose_backend("cuda", torch.bfloat16) == "sdpa"
    assert any("not usable" in r.getMessage() and why in r.getMessage() for r in caplog.records)


def test_auto_logs_its_choice(caplog):
    kernel = build_backend("auto")
    with caplog.at_level(logging.INFO, logger="litmt.attention.backends.auto"):
        kernel.validate(AttentionRequest(device="cpu", dtype=torch.float32, site="encoder_self"))
    assert "attention=auto at encoder_self: using 'sdpa' on cpu (float32)" in caplog.text


def test_fp8_autocast_is_a_no_op_when_disabled_and_explains_itself_otherwise(monkeypatch):
    with fp8_autocast(enabled=False):
        pass
    with pytest.raises(BackendError, match="unknown FP8 format 'E5M3'"):
        fp8_autocast(enabled=True, fp8_format="E5M3")
    for name in ("transformer_engine", "transformer_engine.pytorch"):  # not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendError, match=r"pip install 'litmt\[te\]'"):
        fp8_autocast(enabled=True)


# -- config groups ----------------------------------------------------------------------
@pytest.mark.parametrize("group", sorted(p.stem for p in (CONF / "attention").glob("*.yaml")))
def test_every_attention_group_composes_builds_and_runs(group, monkeypatch):
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
    if group in EMULATIONS:  # the library emulated, its CUDA/half checks relaxed (test-only)
        EMULATIONS[group].install(monkeypatch, allow_cpu_fp32=True)
        allow_cpu_fp32(monkeypatch, get_backend_class(group))
    model = Seq2SeqTransformer(tiny_config(**attention)).eval()
    model.validate_backends("cpu", torch.float32)
    src = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
    tgt_in = torch.tensor([[BOS_ID, 9, 10, 11], [BOS_ID, 12, PAD_ID, PAD_ID]])
    with torch.no_grad():
        logits = model(src, tgt_in)  # (B, T, V)
    assert logits.shape == (2, 4, 16) and torch.isfinite(logits).all()


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
    cfg = tiny_model.tiny_config(
        src_vocab_size=12,
        n_decoder_layers=1,
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


# -- flash / xformers / te plumbing on CPU, through emulations of their libraries ---------
# The real kernels run only on CUDA (test_gpu_backends.py). The emulations in emulations/
# implement each library's own rules (read from its source), so the packing (cu_seqlens,
# block-diagonal biases, index bookkeeping) and the TE mask/attention types are checked here.
SITE_OF_CASE = {  # where the contract's cases occur in the model
    "self": "encoder_self",
    "cross": "cross",
    "padding": "encoder_self",
    "cross_padding": "cross",
    "causal": "decoder_self",
    "causal_padding": "decoder_self",
    "decode_step": "decoder_self",  # one query against the self-attention cache
    "decode_chunk": "decoder_self",
}


@pytest.mark.parametrize("backend", list(EMULATIONS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_wrappers_through_emulated_libraries(backend, case, monkeypatch):
    EMULATIONS[backend].install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class(backend))
    c = CASES[case]
    q, k, v, mask = make_inputs(c, d=8)  # flash-attn needs a head size multiple of 8
    kernel = build_backend(backend)
    site = SITE_OF_CASE[case]
    kernel.set_site(site, self_attention=site != "cross")
    out = kernel(q, k, v, key_padding_mask=mask, causal=c["causal"])
    ref = build_backend("math")(q, k, v, key_padding_mask=mask, causal=c["causal"])
    rows = real_rows(c, mask)
    assert out.shape == ref.shape
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)
    if mask is not None and c["tq"] == c["tk"] and (c["causal"] or backend == "te"):
        assert out[~rows].abs().max() == 0  # packed / TE "self" paths: padded query rows 0


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
    calls = EMULATIONS["te"].install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class("te"))
    c = CASES[case]
    q, k, v, mask = make_inputs(c, d=8)
    kernel = build_backend("te")
    site = SITE_OF_CASE[case]
    kernel.set_site(site, self_attention=site != "cross")
    kernel(q, k, v, key_padding_mask=mask, causal=c["causal"])
    assert [(call.attention_type, call.attn_mask_type) for call in calls] == [TE_MASK_TYPES[case]]
    (mod,) = kernel._modules_by_key.values()
    assert (mod.qkv_format, mod.attn_mask_type) == ("bshd", "no_mask")  # never TE's defaults


# -- benchmark script -------------------------------------------------------------------
@pytest.mark.slow
def test_benchmark_script_smoke():
    """One tiny cell end to end: subprocess worker, table, claims section (prints only)."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.benchmark_attention",
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
        cwd=CONF.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "**causal, forward+backward time (ms)**" in proc.stdout
    assert "| linear |" in proc.stdout and "| math |" in proc.stdout
    assert "linear >= 10x faster than sdpa at L=32768: not measured" in proc.stdout
