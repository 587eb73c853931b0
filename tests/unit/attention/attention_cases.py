"""Shared inputs of the attention tests: the shape cases and random q, k, v with their mask.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

# lengths: real keys per row (None = no padding mask); causal: query i sees j <= i + Tk - Tq
CASES = {
    "self": dict(tq=9, tk=9, lengths=None, causal=False),
    "cross": dict(tq=5, tk=11, lengths=None, causal=False),
    "padding": dict(tq=7, tk=7, lengths=[7, 3, 5], causal=False),
    "cross_padding": dict(tq=4, tk=10, lengths=[10, 2, 6], causal=False),
    "causal": dict(tq=8, tk=8, lengths=None, causal=True),
    "causal_padding": dict(tq=8, tk=8, lengths=[8, 4, 6], causal=True),
    "decode_step": dict(tq=1, tk=12, lengths=None, causal=False),
    "decode_chunk": dict(tq=3, tk=12, lengths=None, causal=True),
}


def lengths_mask(lengths: list[int], t: int) -> Tensor:
    """(B, T) bool, True = padding, for rows of `lengths` real positions."""
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def make_inputs(
    case: dict, b: int = 3, h: int = 2, d: int = 16, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Random q (B, Tq, H, D), k, v (B, Tk, H, D) (drawn in that order) and the case's
    key padding mask (B, Tk) or None."""
    q = torch.randn(b, case["tq"], h, d, generator=generator)
    k = torch.randn(b, case["tk"], h, d, generator=generator)
    v = torch.randn(b, case["tk"], h, d, generator=generator)
    mask = lengths_mask(case["lengths"], case["tk"]) if case["lengths"] else None
    return q, k, v, mask
