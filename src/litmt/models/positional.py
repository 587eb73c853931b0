"""Positional encodings: sinusoidal (Vaswani et al. 2017), learned, and rotary (RoPE).

Shapes: B batch, T length, C d_model, H heads, D head dim.
Absolute encodings are added to the embeddings; rotary rotates q and k inside attention,
before the kernel, so it works with every backend.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sin/cos table (non-persistent: it is not stored in checkpoints)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        pos = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (T, 1)
        inv = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
        )
        table = torch.zeros(max_positions, d_model)
        table[:, 0::2] = torch.sin(pos * inv)
        table[:, 1::2] = torch.cos(pos * inv[: d_model // 2])
        self.register_buffer("table", table, persistent=False)  # (T_max, C)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings for positions offset..offset+length-1, shape (length, C)."""
        if offset + length > self.table.size(0):
            raise ValueError(
                f"sequence of {offset + length} positions exceeds model.max_positions={self.table.size(0)}"
            )
        return self.table[offset : offset + length]


class SplitSinusoidalPositionalEncoding(SinusoidalPositionalEncoding):
    """The same frequencies, laid out as Marian's (transformers' `MarianSinusoidalPositionalEmbedding`):
    sin of every frequency in channels [0, C/2), cos in [C/2, C). Computed in float64, then
    rounded to float32, as transformers does (non-persistent)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        nn.Module.__init__(self)
        pos = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (T, 1)
        exponent = torch.arange(0, d_model, 2, dtype=torch.float64) / d_model  # (C/2,)
        angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponent)  # (T, C/2)
        table = torch.cat([angle.sin(), angle.cos()], dim=-1).float()  # (T, C)
        self.register_buffer("table", table, persistent=False)  # (T_max, C)


class LearnedPositionalEncoding(nn.Module):
    """A trained embedding per position."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings for positions offset..offset+length-1, shape (length, C)."""
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds model.max_positions="
                f"{self.embedding.num_embeddings}"
            )
        return self.embedding.weight[offset : offset + length]


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021), rotate-half form, applied to q/k of shape (B, T, H, D)."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)  # (T, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (T, D)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate x (B, T, H, D) as if it sat at positions offset..offset+T-1."""
        t = x.size(1)
        if offset + t > self.cos.size(0):
            raise ValueError(
                f"sequence of {offset + t} positions exceeds model.max_positions={self.cos.size(0)}"
            )
        cos = self.cos[offset : offset + t, None, :].to(x.dtype)  # (T, 1, D)
        sin = self.sin[offset : offset + t, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos + rotated * sin
