"""`flex`: torch.nn.attention.flex_attention, compiled, with block masks.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, Bp/Tp bucketed B/T.

One ``mask_mod(b, h, q_idx, kv_idx) -> bool`` composes the requested pattern: key padding,
causal, a sliding window (``window``) and a fixed/strided block-sparse layout (``sparse``).
``create_block_mask`` turns it into a `BlockMask`, so fully masked tiles are skipped by the
compiled kernel.

Bounded compiles. ``torch.compile`` specialises on every input shape and on the Python
values a ``mask_mod`` closes over, and past dynamo's recompile limit (8) it silently runs
eager flex, which materialises the full score matrix. So the compiled path:

- pads B to the next power of two and T to a multiple of ``kernel_block_size`` (padded
  rows and positions are masked out, so whole padded tiles are skipped, and sliced off);
- closes its ``mask_mod`` only over tensors (key validity, causal flag, layout) and over
  values fixed per kernel (window, sparse layout parameters), never over T or B.

A kernel therefore compiles once per (Bp, Tp, H, D, dtype, device, autograd) bucket: with
B <= 2^k and T <= L that is at most (k + 1) * ceil(L / kernel_block_size) shapes per
(H, D, dtype). At most `MAX_COMPILES` buckets are compiled per process; a shape beyond
that runs the dense path below (one warning), never eager flex. The compiled kernel, its
buckets and its fallback are kept in `litmt.attention.backends.flex_compile`.

Where the compiled kernel cannot run, the same ``mask_mod`` is materialised as a dense
boolean mask and handed to `sdpa`, so every path computes the same function:

- autograd on CPU (torch has no CPU backward for flex attention),
- Tq != Tk (decoder steps against a KV cache: every step would be a new compiled shape),
- ``torch.compile`` cannot build a kernel here (no C++ compiler, no Triton, a GPU too old
  for Triton, a compiler bug, a platform torch.compile refuses): one warning, then eager
  flex on the exact shapes for the rest of the process, and `compile_fallback()` returns
  why (a caller that needs the compiled kernel checks it). Any other error, out-of-memory
  included, propagates.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.backends.flex_compile import (
    MAX_COMPILES,
    compile_fallback,
    over_cap,
    run_compiled,
)
from litmt.attention.backends.sparse import block_layout, layout_options
from litmt.attention.base import (
    AttentionKernel,
    AttentionRequest,
    BackendSupport,
    int_option,
    reject_unknown_options,
    safe_padding_mask,
)
from litmt.errors import BackendError

__all__ = ["MAX_COMPILES", "FlexAttention", "compile_fallback", "shared_block_mask"]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

_FLEX_OPTIONS = (
    "window",
    "sparse",
    "sparse_block_size",
    "sparse_stride",
    "sparse_summary",
    "compile",
    "kernel_block_size",
)


def _flex_module() -> Any:
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError as exc:  # pragma: no cover - torch >= 2.5 ships it
        raise BackendError(
            f"attention backend 'flex' needs torch >= 2.5 (found {torch.__version__}); "
            "upgrade torch or use attention=sdpa"
        ) from exc
    return module


# The one cache of block masks. With padding, an entry is keyed on the padding-mask tensor's
# identity and version (checked through a weak reference, so a new mask never matches a freed
# one that had the same id): every encoder layer gets the same tensor, so the layers of one
# forward share one `BlockMask`. Without padding the mask depends on shapes only, and an
# entry serves every forward of that shape. Both keys hold everything else the mask depends on.
_SHARED: OrderedDict[tuple[Any, ...], tuple[weakref.ref | None, Any]] = OrderedDict()
_SHARED_SIZE = 32


def shared_block_mask(
    key_padding_mask: Tensor | None, key: tuple[Any, ...], build: Callable[[], Any]
) -> Any:
    """The `BlockMask` built by `build()` for (`key_padding_mask`, `key`): built once, and
    reused while that same mask tensor comes back unchanged (the next layer's call), or for
    every call with `key` when `key_padding_mask` is None (no padding)."""
    ident = None if key_padding_mask is None else (id(key_padding_mask), key_padding_mask._version)
    full = (ident, *key)
    hit = _SHARED.get(full)
    if hit is not None and (hit[0] is None or hit[0]() is key_padding_mask):
        _SHARED.move_to_end(full)
        return hit[1]
    block_mask = build()
    ref = None if key_padding_mask is None else weakref.ref(key_padding_mask)
    _SHARED[full] = (ref, block_mask)
    while len(_SHARED) > _SHARED_SIZE:
        _SHARED.popitem(last=False)
    return block_mask


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class FlexAttention(AttentionKernel):
    """Flex attention with padding / causal / sliding-window / block-sparse block masks.

    Args:
        window: sliding-window half-width (query i sees |i - j| <= window), or None.
        sparse: None, "fixed" or "strided" block-sparse layout (see `litmt.attention.backends.sparse`).
        sparse_block_size: tokens per sparse block.
        sparse_stride: stride of the sparse layout, in blocks.
        sparse_summary: summary blocks per group ("fixed").
        compile: run the compiled flex kernel (True) or eager flex (False; materialises the
            scores, useful for quick tests).
        kernel_block_size: tile size of the block mask (128 is flex's default).
    """

    name = "flex"
    support = BackendSupport(
        dropout=False,
        notes="compiled flex_attention + block masks (padding, causal, local, sparse)",
    )

    def __init__(
        self,
        window: int | None = None,
        sparse: str | None = None,
        sparse_block_size: int = 64,
        sparse_stride: int = 4,
        sparse_summary: int = 1,
        compile: bool = True,
        kernel_block_size: int = 128,
        **unknown: Any,
    ) -> None:
        super().__init__()
        reject_unknown_options(self.name, unknown, _FLEX_OPTIONS)
        self._flex = _flex_module()
        self.window = None if window is None else int_option("window", window, self.name, 0)
        self.sparse = sparse
        self.sparse_block_size, self.sparse_stride, self.sparse_summary = layout_options(
            self.name, sparse, sparse_block_size, sparse_stride, sparse_summary, prefix="sparse_"
        )
        self.compile = bool(compile)
        self.kernel_block_size = int_option("kernel_block_size", kernel_block_size, self.name, 16)
        if self.window is not None or self.sparse is not None:
            # An instance attribute: this configuration is no longer softmax over all keys.
            self.support = replace(type(self).support, exact=False)

    def validate(self, request: AttentionRequest) -> None:
        """Also refuse a window or sparse layout across two sequences (cross-attention)."""
        super().validate(request)
        if request.site == "cross" and (self.window is not None or self.sparse is not None):
            raise BackendError(
                "attention backend 'flex' (at cross) cannot apply a window or sparse layout "
                "across two sequences; set model.attention.cross_options.window=null and "
                "model.attention.cross_options.sparse=null"
            )

    # -- mask --------------------------------------------------------------------------
    def mask_mod(
        self,
        tq: int,
        tk: int,
        causal: bool | Tensor,
        valid: Tensor | None,
        device: Any,
        q_valid: Tensor | None = None,
    ) -> MaskMod:
        """The ``mask_mod`` for one call; query i sits at absolute position Tk - Tq + i.

        Args:
            tq, tk: query/key lengths of the (possibly padded) call.
            causal: bool, or a 0-dim bool tensor (the compiled path: no Python value
                that varies between calls may be closed over).
            valid: (B, Tk) bool, True = a key that may be attended, or None.
            device: where the sparse layout is built.
            q_valid: (Tq,) bool, False = a padded query row (fully masked), or None.
        """
        offset = tk - tq
        window, p = self.window, self.sparse_block_size
        layout = None
        if self.sparse is not None:
            layout = block_layout(
                torch.arange(-(-tk // p), device=device),
                -(-tk // p),
                mode=self.sparse,
                stride=self.sparse_stride,
                summary=self.sparse_summary,
                causal=False,
            )  # (K, K) over absolute blocks; causality is applied per token below
        causal_t = causal if isinstance(causal, Tensor) else None
        causal_b = bool(causal) if causal_t is None else False

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # flex may call mask_mod past the call's lengths (pytorch#137801; inductor's CPU
            # kernel does under ATEN_CPU_CAPABILITY=avx2): tensors are read at clamped indices
            # and those positions are masked.
            ok = (kv_idx >= 0) & (kv_idx < tk) & (q_idx < tq)
            kv_idx = kv_idx.clamp(0, tk - 1)
            q_idx = q_idx.clamp(0, tq - 1)
            qpos = q_idx + offset
            if causal_b:
                ok = ok & (kv_idx <= qpos)
            if causal_t is not None:
                ok = ok & ((kv_idx <= qpos) | ~causal_t)
            if window is not None:
                ok = ok & (kv_idx >= qpos - window) & (kv_idx <= qpos + window)
            if layout is not None:
                ok = ok & layout[qpos // p, kv_idx // p]
            if valid is not None:
                ok = ok & valid[b, kv_idx]
            if q_valid is not None:
                ok = ok & q_valid[q_idx]
            return ok

        return mask_mod

    def block_mask(self, mask_mod: MaskMod, b: int | None, tq: int, tk: int, device: Any) -> Any:
        """The `BlockMask` of `mask_mod` (B = `b`, or None: the same for every row)."""
        return self._flex.create_block_mask(
            mask_mod, b, None, tq, tk, device=device, BLOCK_SIZE=self.kernel_block_size
        )

    # -- forward -------------------------------------------------------------------------
    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D); return (B, Tq, H, D)."""
        b, tq = q.shape[:2]
        tk = k.size(1)
        kpm = safe_padding_mask(key_padding_mask)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if tq != tk or (q.device.type == "cpu" and needs_grad):
            return self._dense(q, k, v, causal, kpm).transpose(1, 2)
        if self.compile and compile_fallback() is None:
            out = self._compiled(q, k, v, causal, kpm, needs_grad, key_padding_mask)
            if out is not None:
                return out.transpose(1, 2)  # (B, Tq, H, D)
            if compile_fallback() is None:  # over MAX_COMPILES: dense, never eager flex
                return self._dense(q, k, v, causal, kpm).transpose(1, 2)
        # Eager flex on the exact shapes: built once per padding mask (the layers of one
        # forward share it); without padding the mask does not depend on the batch, so it
        # is built once per shape.
        rows = None if kpm is None else b
        valid = None if kpm is None else ~kpm  # (B, Tk)
        block_mask = shared_block_mask(
            key_padding_mask if kpm is not None else None,
            ("eager", rows, tq, tk, causal, str(q.device), *self._mask_config()),
            lambda: self.block_mask(
                self.mask_mod(tq, tk, causal, valid, q.device), rows, tq, tk, q.device
            ),
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            out = self._flex.flex_attention(q, k, v, block_mask=block_mask)  # (B, H, Tq, D)
        return out.transpose(1, 2)  # (B, Tq, H, D)

    def _mask_config(self) -> tuple[Any, ...]:
        """The kernel settings a block mask depends on (besides shapes and padding)."""
        return (self.window, self.sparse, self.sparse_block_size, self.sparse_stride,
                self.sparse_summary, self.kernel_block_size)  # fmt: skip

    def _compiled(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        kpm: Tensor | None,
        grad: bool,
        key_padding_mask: Tensor | None,
    ) -> Tensor | None:
        """The compiled kernel on bucketed shapes: (B, H, T, D), or None if it cannot run.

        q, k, v: (B, H, T, D) with Tq == Tk; kpm: (B, T) bool, True = padding, or None
        (`safe_padding_mask` of the caller's `key_padding_mask`, which keys the shared
        block mask).
        """
        b, h, t, d = q.shape
        bp, tp = _next_pow2(b), -(-t // self.kernel_block_size) * self.kernel_block_size
        config = self._mask_config()  # what the closure fixes
        bucket = (bp, h, tp, d, q.dtype, str(q.device), grad, config)
        if over_cap(bucket):
            return None
        pad = (0, 0, 0, tp - t, 0, 0, 0, bp - b)  # (D, T, H, B) right padding
        # contiguous: a zero pad returns the strided view, and strides are compiled in
        q, k, v = (F.pad(x, pad).contiguous() for x in (q, k, v))  # (Bp, H, Tp, D)

        def build() -> Any:
            valid = torch.zeros(bp, tp, dtype=torch.bool, device=q.device)  # (Bp, Tp)
            valid[:b, :t] = True if kpm is None else ~kpm
            q_valid = torch.arange(tp, device=q.device) < t  # (Tp,)
            causal_t = torch.tensor(causal, device=q.device)
            mask_mod = self.mask_mod(tp, tp, causal_t, valid, q.device, q_valid)
            return self.block_mask(mask_mod, bp, tp, tp, q.device)

        # built once per padding mask (or shape): the layers of one forward share it
        shared_key = ("compiled", b, t, bp, tp, causal, str(q.device), *config)
        block_mask = shared_block_mask(key_padding_mask, shared_key, build)
        out = run_compiled(self._flex.flex_attention, q, k, v, block_mask, bucket)
        return None if out is None else out[:b, :, :t]  # (B, H, T, D)

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, kpm: Tensor | None) -> Tensor:
        """The same mask, materialised, through sdpa: q (B, H, Tq, D) -> (B, H, Tq, D)."""
        mask = self.allowed_keys(q.transpose(1, 2), k.transpose(1, 2), kpm, causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask (B|1, 1, Tq, Tk)

    def allowed_keys(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """This call's mask (window, layout, causal, padding), materialised: (B|1, 1, Tq, Tk).

        Heatmaps (`attention_weights`) are softmax attention under it, like `_dense`.
        """
        kpm = safe_padding_mask(pad)
        valid = None if kpm is None else ~kpm  # (B, Tk)
        tq, tk = q.size(1), k.size(1)
        mask_mod = self.mask_mod(tq, tk, causal, valid, q.device)
        b = q.size(0) if kpm is not None else 1
        mask = self._flex.create_mask(mask_mod, b, 1, tq, tk, q.device)
        return mask | ~mask.any(dim=-1, keepdim=True)  # no empty rows

    def extra_repr(self) -> str:
        return (
            f"name={self.name}, window={self.window}, sparse={self.sparse}, compile={self.compile}"
        )
