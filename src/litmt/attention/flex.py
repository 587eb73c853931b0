"""`flex`: torch.nn.attention.flex_attention, compiled, with block masks.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.

One ``mask_mod(b, h, q_idx, kv_idx) -> bool`` composes the requested pattern: key padding,
causal, a sliding window (``window``) and a fixed/strided block-sparse layout (``sparse``).
``create_block_mask`` turns it into a `BlockMask`, so fully masked tiles are skipped by the
compiled kernel. Block masks that do not depend on the batch (no padding) are cached per
(shape, pattern, device); with a padding mask a new one is built per batch.

Where flex cannot run, the same ``mask_mod`` is materialised as a dense boolean mask and
handed to `sdpa`, so every path computes the same function:

- autograd on CPU (torch has no CPU backward for flex attention),
- Tq != Tk (decoder steps against a KV cache: every step would be a new compiled shape),
- a failed ``torch.compile`` (e.g. no C++ compiler on CPU): eager flex, with one warning.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import (
    AttentionKernel,
    AttentionRequest,
    BackendSupport,
    safe_padding_mask,
)
from litmt.attention.local import _no_unknown, _positive_int
from litmt.attention.sparse import SPARSE_MODES, block_layout
from litmt.errors import BackendError

log = logging.getLogger(__name__)

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

_COMPILED: dict[str, Any] = {}  # "fn" -> the compiled flex_attention (one per process)
_CACHE_SIZE = 32
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


class FlexAttention(AttentionKernel):
    """Flex attention with padding / causal / sliding-window / block-sparse block masks.

    Args:
        window: sliding-window half-width (query i sees |i - j| <= window), or None.
        sparse: None, "fixed" or "strided" block-sparse layout (see `litmt.attention.sparse`).
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
        _no_unknown(self.name, unknown, _FLEX_OPTIONS)
        self._flex = _flex_module()
        self.window = None if window is None else _positive_int("window", window, self.name, 0)
        if sparse is not None and sparse not in SPARSE_MODES:
            raise BackendError(
                f"attention backend 'flex': unknown sparse mode '{sparse}'; valid: "
                f"{', '.join(SPARSE_MODES)} or null"
            )
        self.sparse = sparse
        self.sparse_block_size = _positive_int("sparse_block_size", sparse_block_size, self.name, 1)
        self.sparse_stride = _positive_int("sparse_stride", sparse_stride, self.name, 1)
        self.sparse_summary = _positive_int("sparse_summary", sparse_summary, self.name, 1)
        self.compile = bool(compile)
        self.kernel_block_size = _positive_int(
            "kernel_block_size", kernel_block_size, self.name, 16
        )
        if self.window is not None or self.sparse is not None:
            # An instance attribute: this configuration is no longer softmax over all keys.
            self.support = replace(type(self).support, exact=False)
        self._block_masks: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

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
        self, tq: int, tk: int, causal: bool, key_padding_mask: Tensor | None, device: Any
    ) -> MaskMod:
        """The ``mask_mod`` for this call; query i sits at absolute position Tk - Tq + i."""
        offset = tk - tq
        window = self.window
        layout = None
        if self.sparse is not None:
            p = self.sparse_block_size
            layout = block_layout(
                torch.arange(-(-tk // p), device=device),
                -(-tk // p),
                mode=self.sparse,
                stride=self.sparse_stride,
                summary=self.sparse_summary,
                causal=causal,
            )  # (K, K) over absolute blocks
        valid = None if key_padding_mask is None else ~key_padding_mask  # (B, Tk)

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qpos = q_idx + offset
            ok = kv_idx >= 0  # all-True of the right shape
            if causal:
                ok = ok & (kv_idx <= qpos)
            if window is not None:
                ok = ok & (kv_idx >= qpos - window) & (kv_idx <= qpos + window)
            if layout is not None:
                ok = ok & layout[qpos // self.sparse_block_size, kv_idx // self.sparse_block_size]
            if valid is not None:
                ok = ok & valid[b, kv_idx]
            return ok

        return mask_mod

    def block_mask(
        self, mask_mod: MaskMod, b: int | None, tq: int, tk: int, device: Any, cache_key: Any
    ) -> Any:
        """The `BlockMask` of `mask_mod`, cached under `cache_key` unless it is None."""
        if cache_key is not None and cache_key in self._block_masks:
            self._block_masks.move_to_end(cache_key)
            return self._block_masks[cache_key]
        block_mask = self._flex.create_block_mask(
            mask_mod, b, None, tq, tk, device=device, BLOCK_SIZE=self.kernel_block_size
        )
        if cache_key is not None:
            self._block_masks[cache_key] = block_mask
            while len(self._block_masks) > _CACHE_SIZE:
                self._block_masks.popitem(last=False)
        return block_mask

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
        mask_mod = self.mask_mod(tq, tk, causal, kpm, q.device)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if tq != tk or (q.device.type == "cpu" and needs_grad):
            return self._dense(q, k, v, mask_mod, kpm is not None).transpose(1, 2)
        # Without padding the mask does not depend on the batch: build it once per shape.
        cache_key = None if kpm is not None else (tq, tk, causal, str(q.device))
        block_mask = self.block_mask(
            mask_mod, b if kpm is not None else None, tq, tk, q.device, cache_key
        )
        out = self._run(q, k, v, block_mask)  # (B, H, Tq, D)
        return out.transpose(1, 2)  # (B, Tq, H, D)

    def _run(self, q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> Tensor:
        if self.compile and not _COMPILED.get("failed"):
            fn = _COMPILED.get("fn")
            if fn is None:
                fn = _COMPILED["fn"] = torch.compile(self._flex.flex_attention, dynamic=False)
            try:
                return fn(q, k, v, block_mask=block_mask)
            except Exception as exc:  # compiler failures surface as many exception types
                _COMPILED["failed"] = True
                log.warning("flex: torch.compile failed (%s); using eager flex from now on", exc)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            return self._flex.flex_attention(q, k, v, block_mask=block_mask)

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod, batched: bool) -> Tensor:
        """The same mask, materialised, through sdpa: (B, H, Tq, D)."""
        b, _, tq, _ = q.shape
        tk = k.size(2)
        mask = self._flex.create_mask(mask_mod, b if batched else 1, 1, tq, tk, q.device)
        mask = mask | ~mask.any(dim=-1, keepdim=True)  # (B|1, 1, Tq, Tk); no empty rows
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def extra_repr(self) -> str:
        return (
            f"name={self.name}, window={self.window}, sparse={self.sparse}, compile={self.compile}"
        )
