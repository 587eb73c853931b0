"""What one decoder layer keeps across incremental decode steps.

Shapes: B decoder rows (sentences, or sentences x beams), S source length, H heads, D head
dim.

Self-attention's state is the kernel's own `DecodeCache` (`litmt.attention.cache`: every
K/V by default, a window for `local`, running sums for `linear`). Cross-attention's K/V
come from the encoder memory, which does not change while decoding: they are projected
once (`CrossKV`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from litmt.attention.cache import DecodeCache


@dataclass
class CrossKV:
    """Cross-attention keys and values (B, S, H, D) of the encoder memory, once projected."""

    k: Tensor | None = None
    v: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (B',) in that order."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


@dataclass
class LayerCache:
    """A decoder layer's decode state: its self-attention cache and its cross K/V."""

    self_attn: DecodeCache
    cross: CrossKV = field(default_factory=CrossKV)
