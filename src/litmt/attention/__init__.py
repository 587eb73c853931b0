"""Attention kernels behind one contract, chosen by name.

>>> from litmt.attention import build_backend, list_backends
>>> kernel = build_backend("sdpa")
>>> out = kernel(q, k, v, key_padding_mask=mask, causal=False)   # (B, Tq, H, D)
>>> out, weights = kernel.forward_with_weights(q, k, v)           # weights (B, H, Tq, Tk)
>>> cache = kernel.new_cache()                                    # incremental decoding
>>> out = cache.attend(q_new, k_new, v_new)                       # causal over all so far

Backends are registered as "module:Class" strings and imported lazily, so optional packages
(flash-attn, xformers, transformer-engine) are only imported when their backend is built.
"""

from __future__ import annotations

import importlib
from typing import Any

from litmt.attention.base import (
    AttentionKernel,
    AttentionRequest,
    BackendSupport,
    causal_mask,
    safe_padding_mask,
)
from litmt.attention.cache import DecodeCache, KVCache
from litmt.errors import BackendError

_REGISTRY: dict[str, str] = {
    "math": "litmt.attention.backends.math:MathAttention",
    "sdpa": "litmt.attention.backends.sdpa:SDPAAttention",
    "flash": "litmt.attention.backends.flash:FlashAttention",
    "xformers": "litmt.attention.backends.xformers:XFormersAttention",
    "te": "litmt.attention.backends.te:TEAttention",
    "flex": "litmt.attention.backends.flex:FlexAttention",
    "local": "litmt.attention.backends.local:LocalAttention",
    "sparse": "litmt.attention.backends.sparse:SparseAttention",
    "linear": "litmt.attention.backends.linear:LinearAttention",
    "auto": "litmt.attention.backends.auto:AutoAttention",
}


def list_backends() -> list[str]:
    """Names of all registered backends (available on this machine or not)."""
    return sorted(_REGISTRY)


def get_backend_class(name: str) -> type[AttentionKernel]:
    """The kernel class registered as `name`; unknown names raise `BackendError`."""
    if name not in _REGISTRY:
        raise BackendError(
            f"unknown attention backend '{name}'; valid names: {', '.join(list_backends())}"
        )
    module_name, _, cls_name = _REGISTRY[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise BackendError(
                f"attention backend '{name}' is registered but not implemented in this version"
            ) from exc
        raise
    return getattr(module, cls_name)


def build_backend(name: str, **options: Any) -> AttentionKernel:
    """Build the kernel registered as `name` with its `options` (e.g. window=64 for local)."""
    return get_backend_class(name)(**options)


def backend_support(name: str) -> BackendSupport:
    """The support declaration of backend `name` (without importing optional packages)."""
    return get_backend_class(name).support


__all__ = [
    "AttentionKernel",
    "AttentionRequest",
    "BackendSupport",
    "DecodeCache",
    "KVCache",
    "backend_support",
    "build_backend",
    "causal_mask",
    "get_backend_class",
    "list_backends",
    "safe_padding_mask",
]
