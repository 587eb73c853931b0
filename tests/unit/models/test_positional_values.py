"""Positional encodings against independent statements of their formulas, not against
themselves: the sinusoid table against the paper's formula, RoPE against its complex-number
form and its defining property (a query-key score depends only on the offset i - j).

Shapes: T positions, D head dim.
"""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from litmt.models.positional import RotaryEmbedding, SinusoidalPositionalEncoding

D_MODEL = 16
POSITIONS = [0, 1, 2, 7, 31, 63]


def paper_sinusoid(pos: int, dim: int, d_model: int) -> float:
    """Vaswani et al. 2017, section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)), in float64."""
    i = dim // 2
    angle = pos / 10000 ** (2 * i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("d_model", [8, D_MODEL, 64])
def test_sinusoid_table_is_the_papers_formula(d_model: int) -> None:
    table = SinusoidalPositionalEncoding(d_model, max_positions=64)(length=64)  # (T, C)
    assert table.shape == (64, d_model)
    for pos in POSITIONS:
        expected = torch.tensor(
            [paper_sinusoid(pos, c, d_model) for c in range(d_model)], dtype=torch.float64
        )
        torch.testing.assert_close(table[pos].double(), expected, atol=2e-5, rtol=0)


def test_sinusoid_offset_gives_the_later_positions() -> None:
    pe = SinusoidalPositionalEncoding(D_MODEL, max_positions=64)
    later = pe(length=3, offset=30)  # (3, C): positions 30, 31, 32
    for row, pos in enumerate((30, 31, 32)):
        expected = torch.tensor(
            [paper_sinusoid(pos, c, D_MODEL) for c in range(D_MODEL)], dtype=torch.float64
        )
        torch.testing.assert_close(later[row].double(), expected, atol=2e-5, rtol=0)


def paper_rope(x: list[float], pos: int, base: float = 10000.0) -> list[float]:
    """RoPE (Su et al. 2021, eq. 34) in complex form, with litmt's rotate-half pairing: the
    pair (x[k], x[k + D/2]) is the complex number x[k] + i x[k + D/2], multiplied by
    exp(i * pos * base^(-2k/D))."""
    half = len(x) // 2
    out = [0.0] * len(x)
    for k in range(half):
        z = complex(x[k], x[k + half]) * cmath.exp(1j * pos * base ** (-2 * k / len(x)))
        out[k], out[k + half] = z.real, z.imag
    return out


def rotate(rope: RotaryEmbedding, vec: torch.Tensor, pos: int) -> torch.Tensor:
    """`vec` (D,) rotated as if it sat at position `pos` (through the module's offset)."""
    return rope(vec.view(1, 1, 1, -1), offset=pos).view(-1)  # (B=1, T=1, H=1, D) -> (D,)


def test_rope_rotation_is_the_papers_formula() -> None:
    head_dim = 8
    rope = RotaryEmbedding(head_dim, max_positions=64)
    x = torch.randn(head_dim, dtype=torch.float64)
    for pos in POSITIONS:
        expected = torch.tensor(paper_rope(x.tolist(), pos), dtype=torch.float64)
        got = rotate(rope, x.float(), pos).double()
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    # a whole sequence at once equals the positions one by one
    seq = torch.randn(2, 5, 3, head_dim)  # (B, T, H, D)
    out = rope(seq, offset=4)
    for t in range(5):
        torch.testing.assert_close(out[:, t], rope(seq[:, t : t + 1], offset=4 + t)[:, 0])


def test_rope_score_depends_only_on_the_relative_position() -> None:
    head_dim = 16
    rope = RotaryEmbedding(head_dim, max_positions=64)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(i: int, j: int) -> float:
        return float(rotate(rope, q, i) @ rotate(rope, k, j))

    plain = float(q @ k)  # the score without any position
    for delta in (-5, -1, 1, 3, 12):
        pairs = [(i, i - delta) for i in range(20, 40, 4)]
        scores = [score(i, j) for i, j in pairs]
        assert max(scores) - min(scores) < 1e-4, (delta, scores)  # only i - j matters
        assert abs(scores[0] - plain) > 1e-2, delta  # ... and it does matter
    assert score(9, 9) == pytest.approx(plain, abs=1e-4)  # same position: no rotation left
    assert abs(score(10, 7) - score(7, 10)) > 1e-2  # the sign of the offset matters too
