"""Decode-time state of causal self-attention: the stateful part of the kernel contract.

Shapes: B rows (sentences, or sentences x beams), Tq new positions, T positions decoded so
far, H heads, D head dim.

Incremental decoding feeds a decoder self-attention layer a few new positions at a time
(one per step). The layer keeps what it needs of the past in a `DecodeCache`, made by its
kernel (`AttentionKernel.new_cache`), and calls::

    out = cache.attend(q, k, v)   # q, k, v: (B, Tq, H, D) of the new positions -> (B, Tq, H, D)

which stores the new keys/values and returns causal attention of the new queries over every
position so far, exactly what the kernel computes in a full causal pass. Beam search moves
rows between steps with ``cache.reorder(index)``.

`KVCache`, the default, keeps every K/V and calls the kernel over all of them: O(T) per
step. A kernel that needs less overrides `new_cache`: `local` keeps its window (O(window)),
`linear` keeps its running sums (O(1) in T).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

# A kernel (`litmt.attention.base.AttentionKernel`): called as kernel(q, k, v, causal=...).
# Typed structurally so that this module does not import base (which imports this one).
Kernel = Callable[..., Tensor]


class DecodeCache(ABC):
    """What one causal self-attention layer keeps between incremental decode steps."""

    @abstractmethod
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store the new positions' `k`, `v` and attend `q` causally over all positions.

        Args:
            q, k, v: (B, Tq, H, D) for the Tq new positions (no padding among them).

        Returns:
            (B, Tq, H, D)
        """

    @abstractmethod
    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) in that order (beams that survived a step, or fan-out)."""


class KVCache(DecodeCache):
    """Every position's keys and values, in a buffer that grows by doubling.

    Instead of `torch.cat`-ing the whole history every step (a fresh allocation and an O(T)
    copy per step and layer), new positions are written into a buffer sized for the whole
    search when the caller knows its length (`capacity`), or that doubles when full.

    Args:
        kernel: the kernel to attend with.
        capacity: positions to allocate at the first append (None: 16, then doubling).
    """

    def __init__(self, kernel: Kernel, capacity: int | None = None) -> None:
        self.kernel = kernel
        self.capacity = capacity
        self.length = 0
        self._k: Tensor | None = None  # (B, capacity, H, D); positions >= length are garbage
        self._v: Tensor | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """See `DecodeCache.attend`."""
        k_all, v_all = self.append(k, v)  # (B, T + Tq, H, D)
        # One new query sees every key: no mask. Several: causal, aligned to the last key.
        return self.kernel(q, k_all, v_all, causal=q.size(1) > 1)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions `k`, `v` (B, Tq, H, D); return all (B, T + Tq, H, D)."""
        start, end = self.length, self.length + k.size(1)
        if self._k is None or self._v is None or end > self._k.size(1):
            self._grow(k, end)
        assert self._k is not None and self._v is not None
        self._k[:, start:end] = k
        self._v[:, start:end] = v
        self.length = end
        return self._k[:, :end], self._v[:, :end]

    def _grow(self, like: Tensor, needed: int) -> None:
        old = self._k.size(1) if self._k is not None else 0
        capacity = max(self.capacity or 16, needed, 2 * old)
        b, _, h, d = like.shape
        k = like.new_empty(b, capacity, h, d)  # (B, capacity, H, D)
        v = like.new_empty(b, capacity, h, d)
        if self._k is not None and self._v is not None:
            k[:, : self.length] = self._k[:, : self.length]
            v[:, : self.length] = self._v[:, : self.length]
        self._k, self._v = k, v

    def reorder(self, index: Tensor) -> None:
        """See `DecodeCache.reorder`; copies only the decoded part of the buffer."""
        if self._k is None or self._v is None:
            return
        n = self.length
        shape = (index.numel(), *self._k.shape[1:])  # (B', capacity, H, D)
        k, v = self._k.new_empty(shape), self._v.new_empty(shape)
        torch.index_select(self._k[:, :n], 0, index, out=k[:, :n])
        torch.index_select(self._v[:, :n], 0, index, out=v[:, :n])
        self._k, self._v = k, v
