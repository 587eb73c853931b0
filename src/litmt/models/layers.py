"""Feed-forward block and encoder/decoder layers (pre- or post-norm).

Shapes: B batch, S source length, T target length, C d_model.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from litmt.models.cache import LayerCache
from litmt.models.config import TransformerConfig
from litmt.models.mha import MultiHeadAttention
from litmt.models.positional import RotaryEmbedding


class FeedForward(nn.Module):
    """Position-wise FFN: Linear → activation → dropout → Linear (SwiGLU gates the first)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.activation = cfg.activation
        width = 2 * cfg.d_ff if cfg.activation == "swiglu" else cfg.d_ff
        self.fc1 = nn.Linear(cfg.d_model, width, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, C)."""
        h = self.fc1(x)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "silu":
            h = F.silu(h)
        else:
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        return self.fc2(self.dropout(h))


def _attention(
    cfg: TransformerConfig, site: str, rotary: RotaryEmbedding | None
) -> MultiHeadAttention:
    name, options = cfg.attention.backend(site)
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        backend=name,
        backend_options=options,
        self_attention=site != "cross",
        dropout=cfg.attention_dropout,
        bias=cfg.bias,
        rotary=rotary if site != "cross" else None,
        site=site,
    )


class EncoderLayer(nn.Module):
    """Self-attention + FFN, each wrapped in a residual with LayerNorm."""

    def __init__(self, cfg: TransformerConfig, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg, "encoder_self", rotary)
        self.ffn = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, src_padding_mask: Tensor | None) -> Tensor:
        """x (B, S, C), src_padding_mask (B, S) bool True = pad -> (B, S, C)."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), key_padding_mask=src_padding_mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, key_padding_mask=src_padding_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """Causal self-attention + cross-attention + FFN, each residual with LayerNorm."""

    def __init__(self, cfg: TransformerConfig, rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg, "decoder_self", rotary)
        self.cross_attn = _attention(cfg, "cross", None)
        self.ffn = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None,
        cache: LayerCache | None = None,
        offset: int = 0,
    ) -> Tensor:
        """x (B, T, C), memory (B, S, C), src_padding_mask (B, S) -> (B, T, C).

        With `cache`, x holds the next positions from `offset` on (incremental decoding).
        """
        sc = cache.self_attn if cache is not None else None
        cc = cache.cross if cache is not None else None
        mask, d = src_padding_mask, self.dropout
        if self.norm_first:
            x = x + d(self.self_attn(self.norm1(x), causal=True, cache=sc, offset=offset))
            x = x + d(self.cross_attn(self.norm2(x), memory, key_padding_mask=mask, cache=cc))
            return x + d(self.ffn(self.norm3(x)))
        x = self.norm1(x + d(self.self_attn(x, causal=True, cache=sc, offset=offset)))
        x = self.norm2(x + d(self.cross_attn(x, memory, key_padding_mask=mask, cache=cc)))
        return self.norm3(x + d(self.ffn(x)))
