"""The epoch plan of the token-budget batch sampler (`litmt.data.batching.sampler`): the
bucketing sort, the greedy packing into batches, the split that makes the batch count
divisible by the world size, and `EpochPlan`, all batches of an epoch as ranges of one order
array.

Every (N,) array is built a chunk at a time (`chunk_slices`), so that the private memory of
planning does not grow with the corpus when the large arrays are memory-mapped scratch
files (`litmt.data.batching.scratch`).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from litmt.data.batching.scratch import Scratch
from litmt.errors import ConfigError

_PACK_CHUNK = 1 << 18  # examples converted to python ints at a time while packing
_SORT_CHUNK = 1 << 18  # examples per chunk of the counting sort (`bucket_sort`): its
# int64 temporaries, about 80 bytes per example of a chunk, are the peak of planning
_FILL_CHUNK = 1 << 20  # examples per chunk when filling plan arrays
_MAX_SORT_KEYS = 1 << 24  # larger key ranges (absurd lengths) fall back to a lexsort


def signed_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """`lengths` as a signed integer array, without a copy when it already is one (the
    memory-mapped cache's int32 lengths stay on disk)."""
    arr = np.asarray(lengths)
    if arr.dtype.kind != "i":
        arr = arr.astype(np.int64)
    return arr


def chunk_slices(n: int, size: int = _FILL_CHUNK) -> Iterator[slice]:
    """Consecutive slices covering range(n), `size` items each (the last may be shorter)."""
    for a in range(0, n, size):
        yield slice(a, min(a + size, n))


def cost_lengths(src: np.ndarray, tgt: np.ndarray, scratch: Scratch) -> np.ndarray:
    """(N,) padded cost `max(src, tgt)` per example, computed a chunk at a time into a scratch
    array: int16 when every value fits (a quarter of int64), else the wider input dtype."""
    n = len(src)
    wide = np.result_type(src.dtype, tgt.dtype)
    fits = n == 0 or max(int(src.max()), int(tgt.max())) < 2**15
    out = scratch.empty(n, np.int16 if fits and wide.itemsize > 2 else wide)
    for c in chunk_slices(n):
        np.maximum(src[c], tgt[c], out=out[c], casting="unsafe")
    return out


def bucket_sort(
    order: np.ndarray,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Stable sort of `order` that puts examples of similar source *and* target length together.

    Primary key: the padded cost `max(src, tgt)`. Within one cost the examples run from
    "target longer" to "source longer" (key `src - tgt`), in alternating direction for odd
    and even costs, so that neighbours across a cost boundary also have similar shapes (a
    boustrophedon walk over the length grid). On Multi30k with 4096-token batches this pads
    3.6 % of all positions, against 7.2 % for a plain (source, target) lexicographic sort.
    Examples with equal keys keep their (shuffled) order, so batches still vary per epoch.

    Args:
        order: (N,) example positions.
        src_lengths, tgt_lengths: lengths of all examples, indexed by position.
        out: (N,) array to write the result into (e.g. a file-backed scratch array), or
            None for a new array. Must not be `order` itself.

    Returns:
        (N,) the same positions, sorted (`out` when given).
    """
    n = len(order)
    if out is None:
        out = np.empty_like(order)
    if n == 0:
        return out
    top = int(max(src_lengths.max(), tgt_lengths.max()))  # every cost and |diff| <= top
    width = 2 * top + 1  # key = cost * width + diff + top: ordered like (cost, diff)
    if (top + 1) * width > _MAX_SORT_KEYS or n <= _SORT_CHUNK:  # few examples or huge lengths
        s, t = src_lengths[order], tgt_lengths[order]
        cost = np.maximum(s, t)
        diff = np.where(cost % 2 == 0, s - t, t - s)
        out[:] = order[np.lexsort((diff, cost))]  # last key is primary; lexsort is stable
        return out

    def keys(a: int) -> np.ndarray:
        o = order[a : a + _SORT_CHUNK]
        s, t = src_lengths[o].astype(np.int64), tgt_lengths[o].astype(np.int64)
        cost = np.maximum(s, t)
        return cost * width + np.where(cost % 2 == 0, s - t, t - s) + top

    # The same stable order as the lexsort above, as a counting sort over the (small) key
    # range, a chunk at a time: memory is one chunk's temporaries, whatever N is.
    nkeys = (top + 1) * width
    counts = np.zeros(nkeys, dtype=np.int64)
    for a in range(0, n, _SORT_CHUNK):
        counts += np.bincount(keys(a), minlength=nkeys)
    nxt = np.cumsum(counts) - counts  # first output slot of each key
    for a in range(0, n, _SORT_CHUNK):
        k = keys(a)
        idx = np.argsort(k, kind="stable")
        ks = k[idx]
        group = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])  # first of each equal run
        rank = np.arange(len(ks)) - np.repeat(group, np.diff(np.r_[group, len(ks)]))
        out[nxt[ks] + rank] = order[a : a + _SORT_CHUNK][idx]
        nxt += np.bincount(k, minlength=nkeys)
    return out


def pack_bounds(
    order: np.ndarray, lengths: np.ndarray, max_tokens: int | None, batch_size: int | None
) -> np.ndarray:
    """Where `order` splits into consecutive batches.

    Args:
        order: (N,) example positions in the order to pack them.
        lengths: (num_examples,) padded-cost length of every example (max of source and
            target tensor lengths).
        max_tokens: budget on `len(batch) * max(lengths[batch])`; a single example longer
            than the budget forms a batch of its own.
        batch_size: fixed number of sentences per batch (used when `max_tokens` is None, or
            as an extra cap when both are given).

    Returns:
        (B+1,) int64 bounds: batch j is `order[bounds[j]:bounds[j + 1]]`, none empty.
    """
    n = len(order)
    if max_tokens is None and batch_size is None:
        raise ConfigError("set data.max_tokens or data.batch_size to batch the data")
    if batch_size is not None and max_tokens is None:
        if not n:
            return np.zeros(1, dtype=np.int64)
        return np.r_[np.arange(0, n, batch_size, dtype=np.int64), np.int64(n)]
    bounds = array("q", [0])  # 8 bytes per batch, not a python int object
    start, longest = 0, 0
    for a in range(0, n, _PACK_CHUNK):  # python ints for a chunk at a time
        for i, k in enumerate(lengths[order[a : a + _PACK_CHUNK]].tolist(), start=a):
            new_longest = max(longest, k)
            size = i - start + 1
            full = (batch_size is not None and size > batch_size) or size * new_longest > max_tokens
            if full and i > start:
                bounds.append(i)
                start, longest = i, k
            else:
                longest = new_longest
    if n:
        bounds.append(n)
    return np.frombuffer(bounds, dtype=np.int64).copy()


def pack_batches(
    order: np.ndarray, lengths: np.ndarray, max_tokens: int | None, batch_size: int | None
) -> list[np.ndarray]:
    """`order` split into consecutive batches (`pack_bounds`), as a list of views of it."""
    b = pack_bounds(order, lengths, max_tokens, batch_size).tolist()
    return [order[s:e] for s, e in itertools.pairwise(b)]


def equalize_bounds(
    starts: np.ndarray, ends: np.ndarray, world_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Make the batch count divisible by `world_size` without dropping or repeating examples.

    Args:
        starts, ends: (B,) batch j is positions `starts[j]:ends[j]` of the epoch's order.

    Returns:
        (B',) starts and ends, B' a multiple of `world_size`. Halves the batch with the most
        sentences (first one on ties) until the count divides. Only when every batch has
        one sentence (fewer examples than needed) are batches repeated from the start,
        which the caller must tolerate (duplicate example indexes).
    """
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(starts):
        return starts, ends
    while len(starts) % world_size:
        sizes = ends - starts
        i = int(np.argmax(sizes))
        if sizes[i] < 2:
            rep = np.arange(world_size - len(starts) % world_size) % len(starts)
            return np.r_[starts, starts[rep]], np.r_[ends, ends[rep]]
        mid = starts[i] + sizes[i] // 2
        starts, ends = np.insert(starts, i + 1, mid), np.insert(ends, i, mid)
    return starts, ends


def equalize(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """`equalize_bounds` on a list of batches (arrays of example positions)."""
    if not batches:
        return []
    flat = np.concatenate(batches)
    ends = np.cumsum([len(b) for b in batches], dtype=np.int64)
    starts, ends = equalize_bounds(ends - [len(b) for b in batches], ends, world_size)
    return [flat[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


@dataclass(frozen=True)
class EpochPlan:
    """All batches of one epoch, as ranges of one order array (no list of N-sized objects).

    Attributes:
        order: (N,) example positions (a file-backed scratch array for large corpora).
        starts, ends: (B,) int64; batch j is `order[starts[j]:ends[j]]`, in yield order.
    """

    order: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def for_rank(self, rank: int, world_size: int) -> EpochPlan:
        """The batches rank `rank` of `world_size` gets: `rank, rank + W, ...` (views)."""
        return EpochPlan(self.order, self.starts[rank::world_size], self.ends[rank::world_size])

    def batches(self) -> list[np.ndarray]:
        """The batches as a list of views of `order`."""
        bounds = zip(self.starts.tolist(), self.ends.tolist(), strict=True)
        return [self.order[s:e] for s, e in bounds]
