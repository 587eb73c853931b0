"""`Linear`: an `nn.Linear` whose CPU inference GEMMs can run on oneDNN with a packed weight.

Shapes: N rows (any leading dims flattened), C_in input features, C_out output features.

PyTorch's CPU `F.linear` calls the BLAS it was built with (MKL in the official wheels). On
CPUs where that BLAS is not at its best (MKL on AMD processors falls back to generic
kernels), oneDNN's fp32 GEMM with a weight packed once into its blocked layout is faster:
1.3–1.8× on the decoder-step shapes of beam search (160 rows) on a 2-core AMD EPYC (see
docs/benchmarks.md). Both compute the same fp32 product (no reduced-precision math), so
results agree to fp32 rounding.

Inference (no gradient needed: eval, decoding under `torch.no_grad`/`torch.inference_mode`)
uses a packed copy of the weight, made on first use and reused while the weight is
unchanged: it is keyed by the weight's storage and version counter, so `optimizer.step()` or
`load_state_dict` (in-place updates) invalidate it. The copy costs one extra weight's
memory while decoding; a training call drops it.

Training uses oneDNN for the forward GEMM and the input gradient (x W^T and g W; the plain
weight, as it changes every step) and PyTorch's GEMM for the weight gradient (g^T x, where
oneDNN was slower): about 5 % of a training step on that machine. Double backward is not
supported on this path.

Anything else — other dtypes or devices, autocast, `torch.compile` graphs — uses `F.linear`.

Backends (`gemm` attribute, or `Seq2SeqTransformer.set_gemm`):

- ``auto``: oneDNN for fp32 CPU inference when this PyTorch build offers it and the call
  is big enough to gain (`AUTO_MIN_MACS`), else `F.linear`.
- ``onednn``: the same, but raise `ConfigError` when oneDNN is unavailable.
- ``torch``: always `F.linear`.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from litmt.errors import ConfigError

GEMM_BACKENDS = ("auto", "onednn", "torch")

# id(weight) -> (weak reference, (data_ptr, version, shape), packed weight). The weak reference
# drops the entry when the weight is freed; a tied weight (embedding = output projection) is
# packed once. (A WeakKeyDictionary would compare tensors with `==`.)
_PACKED: dict[int, tuple[weakref.ref[Tensor], tuple[int, int, tuple[int, ...]], Tensor]] = {}
# `auto` uses oneDNN from this many multiply-adds per call: below it, oneDNN's fixed cost
# per call (~30 µs on the 2-core benchmark machine, against ~7 µs for `F.linear`) outweighs
# its faster kernel (measured crossover near 1M, e.g. 5 x 256 x 768).
AUTO_MIN_MACS = 1 << 20
_PACK_ROWS = 128  # row-count hint for oneDNN's weight layout (it serves any row count)


def onednn_available() -> bool:
    """True when this PyTorch build has oneDNN's packed fp32 linear (x86 CPU builds do)."""
    ops = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


def check_gemm(name: str) -> str:
    """Validate a `gemm` backend name; ``onednn`` also needs oneDNN in this build."""
    if name not in GEMM_BACKENDS:
        raise ConfigError(f"unknown gemm backend '{name}'; valid names: {', '.join(GEMM_BACKENDS)}")
    if name == "onednn" and not onednn_available():
        raise ConfigError(
            "gemm=onednn needs a PyTorch build with oneDNN (mkldnn) linear ops, which this "
            "one lacks; use gemm=auto or gemm=torch"
        )
    return name


def _packed(weight: Tensor) -> Tensor:
    """oneDNN-blocked copy of `weight` (C_out, C_in), rebuilt when the weight changed."""
    key = (weight.data_ptr(), weight._version, tuple(weight.shape))
    hit = _PACKED.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS)
    wid = id(weight)
    ref = weakref.ref(weight, lambda _, wid=wid: _PACKED.pop(wid, None))
    _PACKED[wid] = (ref, key, packed)
    return packed


def _pointwise(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """oneDNN x (N, C_in) @ weight^T (+ bias); `weight` (C_out, C_in), plain or packed."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _rows(x: Tensor) -> Tensor:
    rows = x.reshape(-1, x.size(-1))  # (N, C_in)
    return rows if rows.is_contiguous() else rows.contiguous()


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., C_in) @ weight (C_out, C_in)^T + bias (C_out,) -> (..., C_out), no autograd."""
    out = _pointwise(_rows(x), _packed(weight), bias)
    return out.view(*x.shape[:-1], weight.size(0))  # (..., C_out)


class _OneDNNLinear(torch.autograd.Function):
    """Differentiable oneDNN linear on 2-D rows: forward and input gradient on oneDNN."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x (N, C_in), weight (C_out, C_in), bias (C_out,) -> (N, C_out)."""
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _pointwise(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        """grad (N, C_out) -> grads of x (N, C_in), weight (C_out, C_in), bias (C_out,)."""
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        gx = _pointwise(grad, weight.t(), None) if ctx.needs_input_grad[0] else None
        gw = grad.t().mm(x) if ctx.needs_input_grad[1] else None
        gb = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # older signature
        return torch.is_autocast_cpu_enabled()


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) with a choice of inference GEMM.

    Args:
        in_features, out_features, bias: as for `nn.Linear`.
        gemm: ``auto`` | ``onednn`` | ``torch`` (see the module docstring).
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, gemm: str = "auto"
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.gemm = check_gemm(gemm)

    def _onednn_mode(self, x: Tensor) -> str | None:
        """ "packed" (no autograd), "autograd" (training) or None (use `F.linear`)."""
        gemm = self.gemm
        if torch.compiler.is_compiling():
            return None  # compiled graphs: F.linear, no guards on shapes
        if gemm == "torch" or x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        if gemm == "auto" and (not _AUTO_OK or x.numel() * self.out_features < AUTO_MIN_MACS):
            return None  # (x.numel() * C_out = rows * C_in * C_out multiply-adds)
        if x.numel() == 0 or self.weight.dtype != torch.float32:
            return None
        if _autocast_on():
            return None
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return "autograd"
        # inference tensors have no version counter to key the packed copy on
        return None if torch.is_inference(self.weight) else "packed"

    def _use_onednn(self, x: Tensor) -> bool:
        """Whether a call with input `x` would run on oneDNN."""
        return self._onednn_mode(x) is not None

    def forward(self, x: Tensor) -> Tensor:
        """(..., C_in) -> (..., C_out)."""
        mode = self._onednn_mode(x)
        if mode == "packed":
            return onednn_linear(x, self.weight, self.bias)
        if mode == "autograd":
            _PACKED.pop(id(self.weight), None)  # training changes the weight: drop the copy
            out = _OneDNNLinear.apply(_rows(x), self.weight, self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gemm={self.gemm}"


_AUTO_OK = onednn_available()
