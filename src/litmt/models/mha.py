"""Multi-head attention: owns the Q/K/V/O weights and delegates the core to a kernel.

Shapes: B batch, T (Tq/Tk) length, C d_model, H heads, D head dim (C = H * D).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from litmt.attention import AttentionKernel, AttentionRequest, build_backend
from litmt.attention.cache import DecodeCache
from litmt.models.cache import CrossKV
from litmt.models.positional import RotaryEmbedding


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with a swappable, parameter-free kernel.

    Self-attention uses one fused QKV projection; cross-attention projects queries from the
    decoder and keys/values (fused KV) from the encoder memory.

    Args:
        d_model: model width C.
        n_heads: heads H.
        backend: kernel name (see `litmt.attention.list_backends()`).
        backend_options: options for the kernel (e.g. ``{"window": 64}``).
        self_attention: fused QKV from one input (True) or Q from x, KV from memory (False).
        dropout: attention-weight dropout probability (training only).
        bias: biases in the projections.
        rotary: a `RotaryEmbedding` applied to q/k (self-attention only), or None.
        site: name used in error messages ("encoder_self", "decoder_self", "cross").
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        backend: str = "sdpa",
        backend_options: dict[str, Any] | None = None,
        self_attention: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
        site: str = "attention",
    ) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.self_attention, self.dropout, self.site = self_attention, dropout, site
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        else:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kernel: AttentionKernel
        self.set_backend(backend, **(backend_options or {}))
        self.rotary = [rotary] if rotary is not None else []  # list: keep it out of children
        self.record_weights = False  # True: full passes keep the kernel's weights below
        self.last_weights: Tensor | None = None  # (B, H, Tq, Tk)

    def set_backend(self, name: str, **options: Any) -> None:
        """Use kernel `name` (weights are untouched: kernels own none)."""
        self.kernel, self.backend_name = build_backend(name, **options), name
        self.kernel.set_site(self.site, self_attention=self.self_attention)

    def validate(self, request: AttentionRequest) -> None:
        """Check the kernel can serve this site's request (raises `BackendError`)."""
        self.kernel.validate(request)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: DecodeCache | CrossKV | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Attend.

        Args:
            x: queries' input (B, Tq, C).
            memory: keys'/values' input (B, Tk, C) for cross-attention; None for self.
            key_padding_mask: (B, Tk) bool, True = padding.
            causal: causal self-attention.
            cache: incremental decoding. Self-attention: the kernel's `DecodeCache` (from
                `kernel.new_cache()`), which stores x's positions and attends causally over
                all positions so far. Cross-attention: a `CrossKV`, filled with memory's K/V
                on the first step and reused after.
            offset: position of x's first token (for rotary encodings when decoding).

        Returns:
            (B, Tq, C)
        """
        if self.self_attention:
            qkv = self.qkv_proj(x).unflatten(-1, (3, self.n_heads, self.head_dim))  # (B,T,3,H,D)
            q, k, v = qkv.unbind(dim=2)  # 3 x (B, T, H, D)
            if self.rotary:
                q, k = self.rotary[0](q, offset), self.rotary[0](k, offset)
            if isinstance(cache, DecodeCache):
                return self._merge(cache.attend(q, k, v))
        else:
            q = self.q_proj(x).unflatten(-1, (self.n_heads, self.head_dim))  # (B, Tq, H, D)
            if isinstance(cache, CrossKV) and cache.k is not None and cache.v is not None:
                k, v = cache.k, cache.v
            else:
                assert memory is not None, "cross-attention needs memory"
                kv = self.kv_proj(memory).unflatten(-1, (2, self.n_heads, self.head_dim))
                k, v = kv.unbind(dim=2)  # 2 x (B, Tk, H, D)
                if isinstance(cache, CrossKV):
                    cache.k, cache.v = k, v
        p = self.dropout if self.training else 0.0
        if self.record_weights:
            out, self.last_weights = self.kernel.forward_with_weights(
                q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=p
            )
        else:
            out = self.kernel(
                q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=p
            )
        return self._merge(out)

    def _merge(self, out: Tensor) -> Tensor:
        return self.out_proj(out.flatten(-2))  # (B, Tq, H, D) -> (B, Tq, C)


@contextmanager
def recording_weights(modules: Iterable[MultiHeadAttention]) -> Iterator[list[MultiHeadAttention]]:
    """The one switch for reading attention weights: inside the block, every full pass
    through `modules` keeps its kernel's weights (B, H, Tq, Tk) in ``last_weights``
    (`forward_with_weights`); on exit, even on an error, recording stops and they are dropped.

    Yields:
        The modules, to read ``last_weights`` from inside the block.
    """
    chosen = list(modules)
    for m in chosen:
        m.record_weights, m.last_weights = True, None
    try:
        yield chosen
    finally:
        for m in chosen:
            m.record_weights, m.last_weights = False, None
