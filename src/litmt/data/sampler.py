"""Token-budget batch sampler with length bucketing, DDP partitioning and mid-epoch resume.

One epoch's plan is a pure function of `(seed, epoch, world_size)`:

1. shuffle the examples (train) with `numpy.random.default_rng([seed, epoch])`;
2. stable-sort them by shape (`bucket_sort`: padded cost, then source-minus-target length
   in alternating direction) within pools of `bucket_pool` batches' worth of examples
   (`None` = the whole split is one pool);
3. pack consecutive examples greedily into batches whose padded size
   `n_sentences * max(longest source, longest target)` stays within `max_tokens`
   (or into batches of `batch_size` sentences);
4. shuffle the batch order (train);
5. make the batch count divisible by the world size by halving the largest batches, so
   every rank gets the same number of batches and every example is seen exactly once
   (only when a split has fewer examples than ranks are batches repeated);
6. rank `r` takes batches `r, r + W, r + 2W, ...`.

With `bucket_pool=None` the sorted sequence of lengths is the same every epoch, so the
number of batches per epoch is constant (which Lightning assumes: it measures
`len(train_dataloader)` once); shuffling before the stable sort still varies which examples
of equal length share a batch. A finite pool gives more varied batches but the count may
change by a few batches between epochs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch.distributed as dist

from litmt.errors import ConfigError

_PACK_CHUNK = 1 << 20  # examples converted to python ints at a time while packing
_SORT_CHUNK = 1 << 20  # examples per chunk of the counting sort (`bucket_sort`)
_MAX_SORT_KEYS = 1 << 24  # larger key ranges (absurd lengths) fall back to a lexsort


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _signed(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """`lengths` as a signed integer array, without a copy when it already is one (the
    memory-mapped cache's int32 lengths stay on disk)."""
    arr = np.asarray(lengths)
    if arr.dtype.kind != "i":
        arr = arr.astype(np.int64)
    return arr


def _narrow(lengths: np.ndarray) -> np.ndarray:
    """`lengths` as int16 when every value fits (a quarter of int64), else unchanged."""
    if len(lengths) and lengths.dtype.itemsize > 2 and int(lengths.max()) < 2**15:
        return lengths.astype(np.int16)
    return lengths


def bucket_sort(order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
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

    Returns:
        (N,) the same positions, sorted.
    """
    n = len(order)
    if n == 0:
        return order
    top = int(max(src_lengths.max(), tgt_lengths.max()))  # every cost and |diff| <= top
    width = 2 * top + 1  # key = cost * width + diff + top: ordered like (cost, diff)
    if (top + 1) * width > _MAX_SORT_KEYS or n <= _SORT_CHUNK:  # few examples or huge lengths
        s, t = src_lengths[order], tgt_lengths[order]
        cost = np.maximum(s, t)
        diff = np.where(cost % 2 == 0, s - t, t - s)
        return order[np.lexsort((diff, cost))]  # last key is primary; lexsort is stable

    def keys(a: int) -> np.ndarray:
        o = order[a : a + _SORT_CHUNK]
        s, t = src_lengths[o].astype(np.int64), tgt_lengths[o].astype(np.int64)
        cost = np.maximum(s, t)
        return cost * width + np.where(cost % 2 == 0, s - t, t - s) + top

    # The same stable order as the lexsort above, as a counting sort over the (small) key
    # range, a chunk at a time: memory is the output plus one chunk, not 6 arrays of N.
    nkeys = (top + 1) * width
    counts = np.zeros(nkeys, dtype=np.int64)
    for a in range(0, n, _SORT_CHUNK):
        counts += np.bincount(keys(a), minlength=nkeys)
    nxt = np.cumsum(counts) - counts  # first output slot of each key
    out = np.empty_like(order)
    for a in range(0, n, _SORT_CHUNK):
        k = keys(a)
        idx = np.argsort(k, kind="stable")
        ks = k[idx]
        group = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])  # first of each equal run
        rank = np.arange(len(ks)) - np.repeat(group, np.diff(np.r_[group, len(ks)]))
        out[nxt[ks] + rank] = order[a : a + _SORT_CHUNK][idx]
        nxt += np.bincount(k, minlength=nkeys)
    return out


def pack_batches(
    order: np.ndarray, lengths: np.ndarray, max_tokens: int | None, batch_size: int | None
) -> list[np.ndarray]:
    """Split `order` into consecutive batches.

    Args:
        order: (N,) example positions in the order to pack them.
        lengths: (num_examples,) padded-cost length of every example (max of source and
            target tensor lengths).
        max_tokens: budget on `len(batch) * max(lengths[batch])`; a single example longer
            than the budget forms a batch of its own.
        batch_size: fixed number of sentences per batch (used when `max_tokens` is None, or
            as an extra cap when both are given).

    Returns:
        list of int64 arrays of example positions.
    """
    if max_tokens is None and batch_size is None:
        raise ConfigError("set data.max_tokens or data.batch_size to batch the data")
    if batch_size is not None and max_tokens is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    bounds = [0]
    start, longest = 0, 0
    for a in range(0, len(order), _PACK_CHUNK):  # python ints for a chunk at a time
        for i, n in enumerate(lengths[order[a : a + _PACK_CHUNK]].tolist(), start=a):
            new_longest = max(longest, n)
            size = i - start + 1
            full = (batch_size is not None and size > batch_size) or size * new_longest > max_tokens
            if full and i > start:
                bounds.append(i)
                start, longest = i, n
            else:
                longest = new_longest
    bounds.append(len(order))
    return [order[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def equalize(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """Make `len(batches)` divisible by `world_size` without dropping or repeating examples.

    Halves the batch with the most sentences (first one on ties) until the count divides.
    Only when every batch has one sentence (fewer examples than needed) are batches
    repeated from the start, which the caller must tolerate (duplicate example indexes).
    """
    batches = list(batches)
    if not batches:
        return batches
    while len(batches) % world_size:
        sizes = [len(b) for b in batches]
        i = int(np.argmax(sizes))
        if sizes[i] < 2:
            need = world_size - len(batches) % world_size
            batches += [batches[j % len(batches)] for j in range(need)]
            break
        half = sizes[i] // 2
        batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
    return batches


class _EpochProxy:
    """Lightning calls `dataloader.batch_sampler.sampler.set_epoch(epoch)`; this forwards it."""

    def __init__(self, owner: TokenBudgetBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._owner.lengths)


class TokenBudgetBatchSampler:
    """Yields lists of example positions; see the module docstring for the plan.

    Args:
        src_lengths: (N,) source tensor lengths.
        tgt_lengths: (N,) target tensor lengths (tokens + 1 for bos/eos).
        max_tokens: padded-token budget per batch (`None` with `batch_size` set = sentences).
        batch_size: sentences per batch (when `max_tokens` is None) or a cap on sentences.
        shuffle: shuffle examples and batch order per epoch (train); False keeps a
            deterministic length-sorted order (valid/test).
        sort: sort by length within pools (bucketing); False = plain batching in order.
        bucket_pool: pool size in batches' worth of examples; None = whole split.
        seed: base seed; the plan depends only on (seed, epoch, world size).
        rank, world_size: this process's place; None = read torch.distributed now.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = 4096,
        batch_size: int | None = None,
        shuffle: bool = True,
        sort: bool = True,
        bucket_pool: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        src, tgt = _signed(src_lengths), _signed(tgt_lengths)
        if src.shape != tgt.shape:
            raise ValueError("src_lengths and tgt_lengths differ in size")
        if max_tokens is not None and max_tokens <= 0:
            raise ConfigError(f"data.max_tokens must be positive, got {max_tokens}")
        if batch_size is not None and batch_size <= 0:
            raise ConfigError(f"data.batch_size must be positive, got {batch_size}")
        if bucket_pool is not None and bucket_pool <= 0:
            raise ConfigError(f"data.bucket_pool must be positive or null, got {bucket_pool}")
        if rank is None or world_size is None:
            rank, world_size = dist_rank_world()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.src_lengths, self.tgt_lengths = src, tgt
        self.lengths = _narrow(np.maximum(src, tgt))  # padded cost per sentence
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.shuffle, self.sort, self.bucket_pool = shuffle, sort, bucket_pool
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.sampler = _EpochProxy(self)  # what Lightning's `_set_sampler_epoch` looks for
        self._resume: dict[str, int] | None = None  # pending mid-epoch resume
        self._yielded = 0  # batches yielded by the current/last `__iter__`
        self._cache: tuple[tuple[int, int], list[np.ndarray]] | None = None

    # -- the plan -----------------------------------------------------------------------
    def _pool_size(self) -> int:
        n = len(self.lengths)
        if self.bucket_pool is None or n == 0:
            return max(n, 1)
        if self.max_tokens is not None:
            per_batch = max(1, self.max_tokens // max(1, int(self.lengths.mean())))
            if self.batch_size is not None:
                per_batch = min(per_batch, self.batch_size)
        else:
            per_batch = self.batch_size or 1
        return max(1, self.bucket_pool * per_batch)

    def global_batches(self, epoch: int, exclude: np.ndarray | None = None) -> list[np.ndarray]:
        """All batches of `epoch` before the split across ranks (steps 1-4)."""
        n = len(self.lengths)
        rng = np.random.default_rng([self.seed, epoch])
        # int32 positions (half of rng.permutation's int64); shuffling them in place draws
        # the same random numbers, so the permutation is rng.permutation(n)'s
        order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        if self.shuffle:
            rng.shuffle(order)
        if exclude is not None and len(exclude):
            order = order[~np.isin(order, exclude)]
        if self.sort and len(order):
            pool = self._pool_size()
            pieces = []
            for a in range(0, len(order), pool):
                pieces.append(bucket_sort(order[a : a + pool], self.src_lengths, self.tgt_lengths))
            order = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)  # no copy of one
        batches = pack_batches(order, self.lengths, self.max_tokens, self.batch_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def rank_batches(
        self, epoch: int, rank: int, world_size: int, exclude: np.ndarray | None = None
    ) -> list[np.ndarray]:
        """The batches rank `rank` of `world_size` gets in `epoch` (steps 5-6)."""
        if exclude is None and self._cache is not None and self._cache[0] == (epoch, world_size):
            batches = self._cache[1]
        else:
            batches = equalize(self.global_batches(epoch, exclude), world_size)
            if exclude is None:
                self._cache = ((epoch, world_size), batches)
        return batches[rank::world_size]

    # -- sampler protocol ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next `__iter__` yields (a pending resume of
        another epoch is dropped)."""
        self.epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != self.epoch:
            self._resume = None

    def _remaining(self) -> tuple[list[np.ndarray], int]:
        """(batches still to yield this epoch, how many were consumed before a resume)."""
        res = self._resume
        if res is None or res["epoch"] != self.epoch:
            return self.rank_batches(self.epoch, self.rank, self.world_size), 0
        consumed = res["consumed"]
        if res["world_size"] == self.world_size:
            return self.rank_batches(self.epoch, self.rank, self.world_size)[consumed:], consumed
        # the world size changed: re-plan the examples nobody has seen yet
        seen = [
            b
            for r in range(res["world_size"])
            for b in self.rank_batches(self.epoch, r, res["world_size"])[:consumed]
        ]
        exclude = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
        return self.rank_batches(self.epoch, self.rank, self.world_size, exclude), consumed

    def __iter__(self) -> Iterator[list[int]]:
        batches, consumed = self._remaining()
        self._resume = None
        self._yielded = consumed
        for b in batches:
            self._yielded += 1
            yield b.tolist()

    def __len__(self) -> int:
        """Batches this rank gets in the current epoch (a full epoch, also after a resume)."""
        return len(self.rank_batches(self.epoch, self.rank, self.world_size))

    # -- resume -------------------------------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this epoch stands: `consumed` batches of this rank already used.

        Args:
            consumed: batches the training loop has really taken; defaults to the number
                this sampler yielded (which runs ahead when DataLoader workers prefetch,
                so `ResumableDataLoader` passes its own count).
        """
        return {
            "epoch": self.epoch,
            "consumed": self._yielded if consumed is None else int(consumed),
            "world_size": self.world_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next `__iter__` of `state['epoch']` skips the consumed batches."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(
                f"resuming with data.seed={self.seed} but the checkpoint used seed "
                f"{state['seed']}; set data.seed={state['seed']} to continue the same epoch"
            )
        self.epoch = int(state["epoch"])
        self._resume = {
            "epoch": self.epoch,
            "consumed": int(state["consumed"]),
            "world_size": int(state.get("world_size", self.world_size)),
        }
