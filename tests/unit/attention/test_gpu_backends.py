"""GPU backends (flash, xformers, te, flex on CUDA, auto) against `math` in fp16/bf16.

Every test is marked `gpu` and skips without CUDA or when the backend's package is not
installed or not usable (`AttentionKernel.unavailable`). Run them on a GPU machine with
``pytest -m gpu`` (the GPU check script runs them too).

The reference is `math` on the same half-precision inputs upcast to float32, so the
tolerance only has to absorb the half-precision arithmetic of the kernel under test.
Padded query rows are excluded where a backend defines them as 0 (packed/varlen paths).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_model import tiny_config

from litmt.attention import build_backend, get_backend_class
from litmt.attention.backends.auto import choose_backend

pytestmark = pytest.mark.gpu

CUDA = torch.cuda.is_available()
CAPABILITY = torch.cuda.get_device_capability() if CUDA else (0, 0)

MIN_CAPABILITY = {"flash": (8, 0), "te": (8, 0)}
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

CASES = {
    "self": dict(tq=64, tk=64, lengths=None, causal=False),
    "padding": dict(tq=48, tk=48, lengths=[48, 17, 30, 1], causal=False),
    "causal": dict(tq=64, tk=64, lengths=None, causal=True),
    "causal_padding": dict(tq=40, tk=40, lengths=[40, 9, 33, 20], causal=True),
    "cross": dict(tq=24, tk=70, lengths=None, causal=False),
    "cross_padding": dict(tq=24, tk=70, lengths=[70, 5, 41, 64], causal=False),
    "decode_step": dict(tq=1, tk=37, lengths=None, causal=False),
    "decode_chunk": dict(tq=4, tk=37, lengths=None, causal=True),
}


def require(backend: str) -> None:
    if not CUDA:
        pytest.skip("needs a CUDA device")
    problem = get_backend_class(backend).unavailable()  # imported, with every name it calls
    if problem is not None and problem[0] == "not installed":
        pytest.skip(f"{problem[1]} is not installed (pip install 'litmt[{backend}]')")
    if problem is not None:
        pytest.skip(f"not usable: {problem[1]}")  # the GPU check's kernel package row says so
    need = MIN_CAPABILITY.get(backend)
    if need and need > CAPABILITY:
        pytest.skip(
            f"{backend} needs sm{need[0]}{need[1]}+, found sm{CAPABILITY[0]}{CAPABILITY[1]}"
        )


def make_inputs(case: dict, dtype: torch.dtype, b: int = 4, h: int = 4, d: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q, shape_k = (b, case["tq"], h, d), (b, case["tk"], h, d)
    q = torch.randn(shape_q, generator=gen, device="cuda").to(dtype)
    k = torch.randn(shape_k, generator=gen, device="cuda").to(dtype)
    v = torch.randn(shape_k, generator=gen, device="cuda").to(dtype)
    mask = None
    if case["lengths"]:
        lengths = torch.tensor(case["lengths"], device="cuda")
        mask = torch.arange(case["tk"], device="cuda")[None, :] >= lengths[:, None]
    return q, k, v, mask


def reference(q, k, v, mask, causal):
    """`math` in float32 on the same (half-precision) values."""
    return build_backend("math")(
        q.float(), k.float(), v.float(), key_padding_mask=mask, causal=causal
    )


def rows(case: dict, mask):
    """Query rows to compare: all, except padded rows of self-attention with padding."""
    b = 4
    if mask is None or case["tq"] != case["tk"]:
        return torch.ones(b, case["tq"], dtype=torch.bool, device="cuda")
    return ~mask


GPU_BACKENDS = {
    "flash": {},
    "xformers": {},
    "te": {},
    "flex": {"compile": False},  # eager here; the compiled kernel is tested once below
    "auto": {},
    "sdpa": {},
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", list(GPU_BACKENDS))
def test_forward_matches_math(backend, case, dtype):
    require(backend)
    c = CASES[case]
    q, k, v, mask = make_inputs(c, dtype)
    out = build_backend(backend, **GPU_BACKENDS[backend])(
        q, k, v, key_padding_mask=mask, causal=c["causal"]
    )
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    ref = reference(q, k, v, mask, c["causal"])
    keep = rows(c, mask)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float()[keep], ref[keep], atol=tol, rtol=tol)


@pytest.mark.parametrize("case", ["padding", "causal", "causal_padding", "cross_padding"])
@pytest.mark.parametrize("backend", list(GPU_BACKENDS))
def test_gradients_match_math(backend, case):
    require(backend)
    c = CASES[case]
    dtype = torch.bfloat16
    q, k, v, mask = make_inputs(c, dtype)
    keep = rows(c, mask)
    grads = []
    kernels = (
        (build_backend(backend, **GPU_BACKENDS[backend]), lambda t: t),
        (build_backend("math"), torch.Tensor.float),
    )
    for kernel, cast in kernels:
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = kernel(*(cast(t) for t in leaves), key_padding_mask=mask, causal=c["causal"])
        (out.float()[keep].square().sum() / keep.sum()).backward()
        grads.append([t.grad.float() for t in leaves])
    for got, want, name in zip(grads[0], grads[1], "qkv", strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2, msg=f"d{name}")


def test_flex_compiled_on_cuda_with_local_window():
    """The compiled Triton kernel, forward and backward, against `local` in float32."""
    require("flex")
    from litmt.attention.backends.flex import compile_fallback

    c = CASES["causal_padding"]
    q, k, v, mask = make_inputs(c, torch.bfloat16)
    keep = rows(c, mask)
    results = []
    for kernel, cast in (
        (build_backend("flex", window=5), lambda t: t),
        (build_backend("local", window=5), torch.Tensor.float),
    ):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = kernel(*(cast(t) for t in leaves), key_padding_mask=mask, causal=True)
        out.float()[keep].sum().backward()
        results.append([out.float()[keep]] + [t.grad.float() for t in leaves])
    why = compile_fallback()
    assert why is None, f"compiled flex fell back to eager: {why}"  # else this tested eager
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", ["local", "sparse", "linear"])
def test_approximate_backends_run_on_cuda(backend):
    require(backend)
    c = CASES["causal_padding"]
    q, k, v, mask = make_inputs(c, torch.bfloat16)
    out = build_backend(backend)(q, k, v, key_padding_mask=mask, causal=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_auto_picks_flash_on_sm80_with_half_inputs():
    require("auto")
    expected = (
        "flash"
        if CAPABILITY >= (8, 0) and get_backend_class("flash").unavailable() is None
        else "sdpa"
    )
    assert choose_backend("cuda", torch.bfloat16) == expected
    assert choose_backend("cuda", torch.float32) == "sdpa"


def test_te_attention_runs_under_fp8_autocast():
    require("te")
    if CAPABILITY < (8, 9):
        pytest.skip("FP8 needs sm89+")
    from litmt.attention.backends.te import fp8_autocast

    c = CASES["causal"]
    q, k, v, _ = make_inputs(c, torch.bfloat16)
    with fp8_autocast(enabled=True):
        out = build_backend("te")(q, k, v, causal=True)
    ref = reference(q, k, v, None, True)
    torch.testing.assert_close(out.float(), ref, atol=1.6e-2, rtol=1.6e-2)


# -- issue items 1, 6, 7: the defects found by reading the libraries' sources ------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_te_cross_attention_with_tq_equal_tk_and_ragged_keys(dtype):
    """At the cross site with Tq == Tk, TE must not take the query lengths from the key mask
    (attention_type "self"): every query row, padded-source sentences included, equals math."""
    require("te")
    c = dict(tq=48, tk=48, lengths=[48, 5, 30, 1], causal=False)
    q, k, v, mask = make_inputs(c, dtype)
    kernel = build_backend("te")
    kernel.set_site("cross", self_attention=False)
    out = kernel(q, k, v, key_padding_mask=mask)
    ref = reference(q, k, v, mask, False)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)  # every row


def test_te_model_forward_with_target_as_long_as_the_source():
    """The training call site: a bf16 model forward, T == S, ragged sources; logits vs math."""
    require("te")
    from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
    from litmt.models import Seq2SeqTransformer
    from litmt.models.config import AttentionConfig

    torch.manual_seed(0)
    cfg = tiny_config(
        src_vocab_size=64,
        d_model=128,
        n_heads=2,
        d_ff=256,
        attention=AttentionConfig(encoder_self="te", decoder_self="te", cross="te"),
    )
    model = Seq2SeqTransformer(cfg).to("cuda", torch.bfloat16).eval()
    lengths = [12, 3, 7, 1]
    src = torch.full((4, 12), PAD_ID, device="cuda")
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, 64, (n - 1,), device="cuda")
        src[i, n - 1] = EOS_ID
    tgt_in = torch.randint(4, 64, (4, 12), device="cuda")
    tgt_in[:, 0] = BOS_ID
    reference_model = copy.deepcopy(model).float()
    reference_model.set_attention_backend("math")
    with torch.no_grad():
        logits = model(src, tgt_in).float()  # (B, T, V)
        ref = reference_model(src, tgt_in)
    # bf16 through 4 layers; a zeroed cross-attention row moves logits by O(1)
    torch.testing.assert_close(logits, ref, atol=1e-1, rtol=5e-2)


def test_compiled_flex_on_cuda_compiles_per_bucket_not_per_shape():
    """More than 8 distinct batch shapes (dynamo's recompile limit) stay within 2 compiles."""
    require("flex")
    from torch._dynamo.utils import counters

    from litmt.attention.backends import flex, flex_compile

    torch._dynamo.reset()
    counters.clear()
    saved = dict(flex_compile.STATE)
    flex_compile.STATE.update(fn=None, why=None, buckets=set(), capped=False)
    try:
        kernel = build_backend("flex")
        shapes = [(b, t) for b in (2, 3, 4) for t in (7, 40, 77, 128)]  # 12 shapes
        for b, t in shapes:
            c = dict(tq=t, tk=t, lengths=[max(1, t - 3 * i) for i in range(b)], causal=False)
            q, k, v, mask = make_inputs(c, torch.bfloat16, b=b)
            out = kernel(q, k, v, key_padding_mask=mask)
            ref = reference(q, k, v, mask, False)
            keep = ~mask
            torch.testing.assert_close(out.float()[keep], ref[keep], atol=1.6e-2, rtol=1.6e-2)
        assert flex.compile_fallback() is None, f"fell back: {flex.compile_fallback()}"
        assert counters["stats"]["unique_graphs"] <= 2
    finally:
        flex_compile.STATE.clear()
        flex_compile.STATE.update(saved)


@pytest.mark.parametrize("causal", [False, True])
def test_xformers_on_a_non_default_device(causal):
    """Biases are built on the tensors' device (`translate device=cuda:1`), not cuda:0."""
    require("xformers")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    c = CASES["causal_padding" if causal else "padding"]
    q, k, v, mask = (t.to("cuda:1") for t in make_inputs(c, torch.float16))
    assert torch.cuda.current_device() == 0
    out = build_backend("xformers")(q, k, v, key_padding_mask=mask, causal=causal)
    assert out.device == q.device
    ref = reference(q, k, v, mask, causal)
    keep = rows(c, mask).to("cuda:1")
    torch.testing.assert_close(out.float()[keep], ref[keep], atol=2e-3, rtol=2e-3)
