"""GPU backends (flash, xformers, te, flex on CUDA, auto) against `math` in fp16/bf16.

Every test is marked `gpu` and skips without CUDA or without the backend's package. Run
them on a GPU machine with ``bash scripts/gpu_check.sh`` (or ``pytest -m gpu``).

The reference is `math` on the same half-precision inputs upcast to float32, so the
tolerance only has to absorb the half-precision arithmetic of the kernel under test.
Padded query rows are excluded where a backend defines them as 0 (packed/varlen paths).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from litmt.attention import build_backend
from litmt.attention.auto import choose_backend

pytestmark = pytest.mark.gpu

CUDA = torch.cuda.is_available()
CAPABILITY = torch.cuda.get_device_capability() if CUDA else (0, 0)

PACKAGES = {"flash": "flash_attn", "xformers": "xformers", "te": "transformer_engine"}
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
    package = PACKAGES.get(backend)
    if package and importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install 'litmt[{backend}]')")
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
        if CAPABILITY >= (8, 0) and importlib.util.find_spec("flash_attn") is not None
        else "sdpa"
    )
    assert choose_backend("cuda", torch.bfloat16) == expected
    assert choose_backend("cuda", torch.float32) == "sdpa"


def test_te_attention_runs_under_fp8_autocast():
    require("te")
    if CAPABILITY < (8, 9):
        pytest.skip("FP8 needs sm89+")
    from litmt.attention.te import fp8_autocast

    c = CASES["causal"]
    q, k, v, _ = make_inputs(c, torch.bfloat16)
    with fp8_autocast(enabled=True):
        out = build_backend("te")(q, k, v, causal=True)
    ref = reference(q, k, v, None, True)
    torch.testing.assert_close(out.float(), ref, atol=1.6e-2, rtol=1.6e-2)
