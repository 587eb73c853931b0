"""`KVCache`: one attention layer's keys and values kept across incremental decode steps.

Shapes: B rows (sentences, or sentences × beams), T cached positions, H heads, D head dim.

Self-attention appends one position per step. Instead of `torch.cat`-ing the whole history
every step (a fresh allocation and an O(T) copy per step and layer), the cache writes into a
buffer sized for the whole search when the caller knows its length (`capacity`, as greedy and
beam search do), or that doubles when full, so an append is O(1) amortised.

Beam search reorders rows every step. When only a few rows change (it keeps most beams in
the row they extend, see `litmt.search`), `reorder` copies just those rows in place;
otherwise it gathers the live part and copies it back, so no second buffer is kept.

Cross-attention K/V are computed once from the encoder memory and only `set`.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values (B, T, H, D) of the positions decoded so far."""

    def __init__(self, capacity: int | None = None) -> None:
        """`capacity`: positions to allocate at the first append (None: 16, then doubling)."""
        self._k: Tensor | None = None  # (B, capacity, H, D); positions >= length are garbage
        self._v: Tensor | None = None
        self.capacity = capacity
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
        self._k, self._v, self.length = k, v, k.size(1)
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
        first = self.capacity or 16
        capacity = max(first, needed, 2 * (self._k.size(1) if self._k is not None else 0))
        b, _, h, d = like.shape
        k = like.new_empty(b, capacity, h, d)  # (B, capacity, H, D)
        v = like.new_empty(b, capacity, h, d)
        if self._k is not None and self._v is not None:
            k[:, : self.length] = self.k
            v[:, : self.length] = self.v
        self._k, self._v = k, v

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
        n = self.length
        if index.numel() == self._k.size(0):  # same rows: gather the live part, copy it back
            for buf in (self._k, self._v):
                live = buf[:, :n]
                live.copy_(live.index_select(0, index))
            return
        shape = (index.size(0), *self._k.shape[1:])  # fewer or more rows: new buffers
        k, v = self._k.new_empty(shape), self._v.new_empty(shape)
        torch.index_select(self._k[:, :n], 0, index, out=k[:, :n])
        torch.index_select(self._v[:, :n], 0, index, out=v[:, :n])
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
