"""Multi-head attention: owns the Q/K/V/O weights and delegates the core to a kernel.

Shapes: B batch, T (Tq/Tk) length, C d_model, H heads, D head dim (C = H * D).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from litmt.attention import AttentionKernel, AttentionRequest, build_backend
from litmt.attention.math import MathAttention
from litmt.models.cache import KVCache
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
        # A child module without parameters: swapping it leaves the state dict unchanged.
        self.kernel: AttentionKernel = build_backend(backend, **(backend_options or {}))
        self.backend_name = backend
        self.rotary = [rotary] if rotary is not None else []  # list: keep it out of children
        self.record_weights = False  # when True, run `math` and keep `last_weights`
        self.last_weights: Tensor | None = None  # (B, H, Tq, Tk)

    def set_backend(self, name: str, **options: Any) -> None:
        """Swap the kernel (weights are untouched)."""
        self.kernel, self.backend_name = build_backend(name, **options), name

    def validate(self, request: AttentionRequest) -> None:
        """Check the kernel can serve this site's request (raises `BackendError`)."""
        self.kernel.validate(request)

    def _split(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.n_heads, self.head_dim))  # (B, T, C) -> (B, T, H, D)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        offset: int = 0,
        group: int = 1,
    ) -> Tensor:
        """Attend.

        Args:
            x: queries' input (B, Tq, C).
            memory: keys'/values' input (B, Tk, C) for cross-attention; None for self.
            key_padding_mask: (B, Tk) bool, True = padding.
            causal: causal self-attention (ignored when decoding one step with a cache).
            cache: where this layer keeps its K/V across decode steps; self-attention
                appends the new positions, cross-attention computes K/V once and reuses them.
            offset: position of x's first token (for rotary encodings when decoding).
            group: cross-attention only: x has `group` consecutive rows per memory row
                (the beams of one sentence), so memory and its K/V are (B/group, Tk, ...).
                Those rows' queries attend to the same keys as one longer query block.

        Returns:
            (B, Tq, C)
        """
        if self.self_attention:
            q, k, v = self._qkv(x)
            if self.rotary:
                q, k = self.rotary[0](q, offset), self.rotary[0](k, offset)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, t+Tq, H, D)
                causal = causal and q.size(1) > 1
        else:
            assert memory is not None or cache
            q = self._split(self.q_proj(x))  # (B, Tq, H, D)
            if cache:
                k, v = cache.k, cache.v
            else:
                k, v = self._kv(memory)
                if cache is not None:  # decoding: kept for every step
                    if k.device.type == "cpu":  # head-major: `sdpa`'s short-query CPU path
                        k, v = _head_major(k), _head_major(v)
                    cache.set(k, v)
        tq = q.size(1)
        if group > 1:  # non-causal cross-attention: a sentence's beams are one query block
            q = q.reshape(-1, group * tq, self.n_heads, self.head_dim)  # (B/G, G*Tq, H, D)
        p = self.dropout if self.training else 0.0
        if self.record_weights:
            out, weights = _MATH.forward_with_weights(
                q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=p
            )
            if group > 1:  # (B/G, H, G*Tq, Tk) -> (B, H, Tq, Tk)
                weights = weights.unflatten(2, (group, tq)).transpose(1, 2).flatten(0, 1)
            self.last_weights = weights
        else:
            out = self.kernel(
                q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=p
            )
        if group > 1:
            out = out.reshape(-1, tq, self.n_heads, self.head_dim)  # (B, Tq, H, D)
        return self.out_proj(out.flatten(-2))  # (B, Tq, H, D) -> (B, Tq, C)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qkv = self.qkv_proj(x).unflatten(-1, (3, self.n_heads, self.head_dim))  # (B, T, 3, H, D)
        return qkv.unbind(dim=2)  # 3 x (B, T, H, D)

    def _kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        kv = self.kv_proj(memory).unflatten(
            -1, (2, self.n_heads, self.head_dim)
        )  # (B, Tk, 2, H, D)
        return kv.unbind(dim=2)  # 2 x (B, Tk, H, D)


def _head_major(x: Tensor) -> Tensor:
    """(B, T, H, D) with (B, H, T, D) memory layout: each head's keys contiguous."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


_MATH = MathAttention()
