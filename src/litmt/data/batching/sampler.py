"""Token-budget batch sampler with length bucketing, DDP partitioning and mid-epoch resume.

One epoch's plan is a pure function of `(seed, epoch, world_size)`:

1. shuffle the examples (train) with `numpy.random.default_rng([seed, epoch])` (when the
   examples themselves change per epoch, as temperature sampling redraws them, their
   lengths come from `epoch_lengths(epoch)`);
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

Steps 2, 3 and 5 and `EpochPlan` live in `litmt.data.batching.plan` (importable from here too).

Memory: the plan is one (N,) order array plus (B,) batch bounds (`EpochPlan`), and the
per-example arrays are built a chunk at a time; with `scratch_dir` set, those of large
splits are memory-mapped scratch files (`litmt.data.batching.scratch`), so the private memory of
planning and iterating an epoch does not grow with the corpus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from litmt.data.batching.plan import (
    EpochPlan,
    bucket_sort,
    chunk_slices,
    cost_lengths,
    equalize,
    equalize_bounds,
    pack_batches,
    pack_bounds,
    signed_lengths,
)
from litmt.data.batching.scratch import Scratch
from litmt.errors import ConfigError

__all__ = [  # the plan's parts are importable from here too (`litmt.data.batching.plan`)
    "EpochPlan",
    "TokenBudgetBatchSampler",
    "bucket_sort",
    "dist_rank_world",
    "equalize",
    "equalize_bounds",
    "pack_batches",
    "pack_bounds",
]


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
        scratch_dir: where the plan's large arrays (the padded costs and each epoch's
            order, about 6 bytes per example on disk) go as memory-mapped files
            (`litmt.data.batching.scratch`); None = in memory.
        epoch_lengths: epoch -> (N,) source and (N,) target tensor lengths of that epoch's
            examples, when they change per epoch (N fixed; `src_lengths`/`tgt_lengths` are
            then one epoch's); None = the same examples every epoch.
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
        scratch_dir: str | Path | None = None,
        epoch_lengths: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        src, tgt = signed_lengths(src_lengths), signed_lengths(tgt_lengths)
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
        self.scratch = Scratch(scratch_dir)
        self.src_lengths, self.tgt_lengths = src, tgt
        self.lengths = cost_lengths(src, tgt, self.scratch)  # padded cost per sentence
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.shuffle, self.sort, self.bucket_pool = shuffle, sort, bucket_pool
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.sampler = _EpochProxy(self)  # what Lightning's `_set_sampler_epoch` looks for
        self._resume: dict[str, int] | None = None  # pending mid-epoch resume
        self._yielded = 0  # batches yielded by the current/last `__iter__`
        self._cache: tuple[tuple[int, int], EpochPlan] | None = None
        self.epoch_lengths = epoch_lengths
        self._lengths_cache: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    # -- the plan -----------------------------------------------------------------------
    def lengths_of(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N,) source, target and padded-cost lengths of `epoch`'s examples."""
        if self.epoch_lengths is None:
            return self.src_lengths, self.tgt_lengths, self.lengths
        if self._lengths_cache is not None and self._lengths_cache[0] == epoch:
            return self._lengths_cache[1]
        self._lengths_cache = None  # free the previous epoch's arrays first
        src, tgt = (signed_lengths(x) for x in self.epoch_lengths(epoch))
        if src.shape != tgt.shape or len(src) != len(self.lengths):
            raise ValueError(
                f"epoch {epoch} has {len(src)}/{len(tgt)} lengths, not {len(self.lengths)}"
            )
        lengths = (src, tgt, cost_lengths(src, tgt, self.scratch))
        self._lengths_cache = (epoch, lengths)
        return lengths

    def _pool_size(self, lengths: np.ndarray) -> int:
        n = len(lengths)
        if self.bucket_pool is None or n == 0:
            return max(n, 1)
        if self.max_tokens is not None:
            per_batch = max(1, self.max_tokens // max(1, int(lengths.mean())))
            if self.batch_size is not None:
                per_batch = min(per_batch, self.batch_size)
        else:
            per_batch = self.batch_size or 1
        return max(1, self.bucket_pool * per_batch)

    def _order(self, n: int, rng: np.random.Generator, exclude: np.ndarray | None) -> np.ndarray:
        """(N,) the epoch's example positions before sorting (step 1), minus `exclude`."""
        # int32 positions (half of rng.permutation's int64); shuffling them in place draws
        # the same random numbers, so the permutation is rng.permutation(n)'s
        dtype = np.int32 if n < 2**31 else np.int64
        order = self.scratch.empty(n, dtype)
        for c in chunk_slices(n):
            order[c] = np.arange(c.start, c.stop, dtype=dtype)
        if self.shuffle:
            rng.shuffle(order)
        if exclude is None or not len(exclude):
            return order
        exclude = np.unique(exclude)
        keep = [np.count_nonzero(~np.isin(order[c], exclude)) for c in chunk_slices(n)]
        kept = self.scratch.empty(sum(keep), dtype)
        at = 0
        for c, k in zip(chunk_slices(n), keep, strict=True):
            o = order[c]
            kept[at : at + k] = o[~np.isin(o, exclude)]
            at += k
        return kept

    def plan(self, epoch: int, exclude: np.ndarray | None = None) -> EpochPlan:
        """All batches of `epoch` before the split across ranks (steps 1-4)."""
        src, tgt, lengths = self.lengths_of(epoch)
        rng = np.random.default_rng([self.seed, epoch])
        order = self._order(len(lengths), rng, exclude)
        if self.sort and len(order):
            pool = self._pool_size(lengths)
            out = self.scratch.empty(len(order), order.dtype)
            for a in range(0, len(order), pool):
                bucket_sort(order[a : a + pool], src, tgt, out=out[a : a + pool])
            order = out  # the shuffled order is freed (its file unmapped)
        bounds = pack_bounds(order, lengths, self.max_tokens, self.batch_size)
        starts, ends = bounds[:-1], bounds[1:]
        if self.shuffle:
            perm = rng.permutation(len(starts))
            starts, ends = starts[perm], ends[perm]
        return EpochPlan(order, starts, ends)

    def rank_plan(
        self, epoch: int, rank: int, world_size: int, exclude: np.ndarray | None = None
    ) -> EpochPlan:
        """The batches rank `rank` of `world_size` gets in `epoch` (steps 5-6)."""
        if exclude is None and self._cache is not None and self._cache[0] == (epoch, world_size):
            plan = self._cache[1]
        else:
            self._cache = None  # free the previous epoch's plan before building this one
            whole = self.plan(epoch, exclude)
            plan = EpochPlan(whole.order, *equalize_bounds(whole.starts, whole.ends, world_size))
            if exclude is None:
                self._cache = ((epoch, world_size), plan)
        return plan.for_rank(rank, world_size)

    def global_batches(self, epoch: int, exclude: np.ndarray | None = None) -> list[np.ndarray]:
        """All batches of `epoch` before the split across ranks, as a list (`plan`)."""
        return self.plan(epoch, exclude).batches()

    def rank_batches(
        self, epoch: int, rank: int, world_size: int, exclude: np.ndarray | None = None
    ) -> list[np.ndarray]:
        """The batches rank `rank` of `world_size` gets in `epoch`, as a list (`rank_plan`)."""
        return self.rank_plan(epoch, rank, world_size, exclude).batches()

    # -- sampler protocol ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next `__iter__` yields (a pending resume of
        another epoch is dropped)."""
        self.epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != self.epoch:
            self._resume = None

    def _remaining(self) -> tuple[EpochPlan, int]:
        """(batches still to yield this epoch, how many were consumed before a resume)."""
        res = self._resume
        if res is None or res["epoch"] != self.epoch:
            return self.rank_plan(self.epoch, self.rank, self.world_size), 0
        consumed = res["consumed"]
        if res["world_size"] == self.world_size:
            p = self.rank_plan(self.epoch, self.rank, self.world_size)
            return EpochPlan(p.order, p.starts[consumed:], p.ends[consumed:]), consumed
        # the world size changed: re-plan the examples nobody has seen yet
        seen = [
            b
            for r in range(res["world_size"])
            for b in self.rank_batches(self.epoch, r, res["world_size"])[:consumed]
        ]
        exclude = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
        return self.rank_plan(self.epoch, self.rank, self.world_size, exclude), consumed

    def __iter__(self) -> Iterator[list[int]]:
        plan, consumed = self._remaining()
        self._resume = None
        self._yielded = consumed
        order = plan.order
        for s, e in zip(plan.starts.tolist(), plan.ends.tolist(), strict=True):
            self._yielded += 1
            yield order[s:e].tolist()

    def __len__(self) -> int:
        """Batches this rank gets in the current epoch (a full epoch, also after a resume)."""
        return len(self.rank_plan(self.epoch, self.rank, self.world_size))

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
