"""`KVCache`: one attention layer's keys and values kept across incremental decode steps.

Shapes: B rows (sentences, or sentences × beams), T cached positions, H heads, D head dim.

Self-attention appends one position per step. Instead of `torch.cat`-ing the whole history
every step (a fresh allocation and an O(T) copy per step and layer), the cache writes into a
buffer that doubles when full, so an append is O(1) amortised. Beam search reorders rows
every step; that copy goes into a second (spare) buffer of the same size, and the two swap,
so a steady-state step allocates nothing.

When only a few rows change (beam search keeps most beams in the row they extend, see
`litmt.search`), `reorder` copies just those rows in place instead of the whole cache.

Cross-attention K/V are computed once from the encoder memory and only `set`.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values (B, T, H, D) of the positions decoded so far."""

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, capacity, H, D); positions >= length are garbage
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # same shape, reused by `reorder`
        self.length = 0

    def __bool__(self) -> bool:
        """True once something is cached."""
        return self._k is not None

    @property
    def k(self) -> Tensor:
        """Cached keys (B, T, H, D) (a view into the buffer)."""
        assert self._k is not None
        return self._k[:, : self.length]

    @property
    def v(self) -> Tensor:
        """Cached values (B, T, H, D) (a view into the buffer)."""
        assert self._v is not None
        return self._v[:, : self.length]

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store `k`, `v` (B, T, H, D) as they are (cross-attention: computed once)."""
        self._k, self._v, self._spare, self.length = k, v, None, k.size(1)
        return k, v

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions `k`, `v` (B, Tq, H, D); return all (B, T + Tq, H, D)."""
        start, end = self.length, self.length + k.size(1)
        if self._k is None or self._v is None or end > self._k.size(1):
            self._grow(k, end)
        assert self._k is not None and self._v is not None
        self._k[:, start:end] = k
        self._v[:, start:end] = v
        self.length = end
        return self.k, self.v

    def _grow(self, like: Tensor, needed: int) -> None:
        capacity = max(16, needed, 2 * (self._k.size(1) if self._k is not None else 0))
        b, _, h, d = like.shape
        k = like.new_empty(b, capacity, h, d)  # (B, capacity, H, D)
        v = like.new_empty(b, capacity, h, d)
        if self._k is not None and self._v is not None:
            k[:, : self.length] = self.k
            v[:, : self.length] = self.v
        self._k, self._v, self._spare = k, v, None

    def reorder(self, index: Tensor, moved: tuple[Tensor, Tensor] | None = None) -> None:
        """Keep rows `index` (B',) in that order, e.g. the beams that survived a step.

        `moved` = (dst, src) from `moved_rows(index)`: B' == B and row dst[i] takes row
        src[i], every other row stays; then only those rows are copied, in place.
        """
        if self._k is None or self._v is None:
            return
        if moved is not None:
            dst, src = moved
            n = self.length
            for buf in (self._k, self._v):
                live = buf[:, :n]
                live.index_copy_(0, dst, live.index_select(0, src))  # sources read first
            return
        shape = (index.size(0), *self._k.shape[1:])
        if self._spare is not None and self._spare[0].shape == shape:
            k, v = self._spare
        else:
            k, v = self._k.new_empty(shape), self._v.new_empty(shape)
        n = self.length
        torch.index_select(self._k[:, :n], 0, index, out=k[:, :n])
        torch.index_select(self._v[:, :n], 0, index, out=v[:, :n])
        same = self._k.shape == shape and self._k.is_contiguous()
        self._spare = (self._k, self._v) if same else None
        self._k, self._v = k, v


def moved_rows(index: Tensor, rows: int) -> tuple[Tensor, Tensor] | None:
    """(dst, src) when `index` (rows,) keeps at least half of the rows in place, else None.

    Copying the changed rows in place moves 2 x |dst| rows (a gather, then a scatter);
    rebuilding the cache moves all of them once, so the in-place copy wins below half.
    Computed on the host (one sync): meant for CPU decoding.
    """
    if index.numel() != rows or index.device.type != "cpu":
        return None
    dst = (index != torch.arange(rows, device=index.device)).nonzero().squeeze(1)  # (M,)
    if 2 * dst.numel() > rows:
        return None
    return dst, index.index_select(0, dst)
