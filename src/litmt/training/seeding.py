"""Per-step random seeds: the same dropout masks on every resume, distinct per rank and batch."""

from __future__ import annotations

_SEED_MIX = 1_000_003  # a prime that spreads (seed, rank, batch) over the 63-bit seed space


def step_seed(seed: int, rank: int, batch: int) -> int:
    """The RNG seed of training micro-batch `batch` (counted over the whole run) on `rank`.

    Dropout masks then depend only on (seed, rank, batch): a resumed run draws exactly the
    masks an uninterrupted run would, and DDP ranks draw different masks.
    """
    return ((int(seed) * _SEED_MIX + int(rank)) * _SEED_MIX + int(batch)) % (2**63 - 1)
