"""A DataLoader whose position inside an epoch is saved in Lightning checkpoints.

Lightning (2.x) stores `dataloader.state_dict()` in the checkpoint (`loops.fit_loop.state_dict.
combined_loader`) for every train dataloader that has `state_dict`/`load_state_dict`, and on
resume calls `load_state_dict` before creating the iterator. The batch sampler computes its
batches in the main process and runs ahead of training when workers prefetch, so the loader
counts the batches it really handed out and saves that count.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from litmt.data.batching.collate import TokenizedPairs, collate
from litmt.data.batching.sampler import TokenBudgetBatchSampler
from litmt.data.batching.scratch import Scratch

_LENGTH_CHUNK = 1 << 20  # examples per chunk when gathering the lengths


class ResumableDataLoader(DataLoader):
    """`DataLoader(dataset, batch_sampler=TokenBudgetBatchSampler, ...)` plus resume state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._consumed = 0

    @property
    def token_sampler(self) -> TokenBudgetBatchSampler:
        sampler = self.batch_sampler
        assert isinstance(sampler, TokenBudgetBatchSampler)
        return sampler

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (Lightning does this itself through `batch_sampler.sampler`)."""
        self.token_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler = self.token_sampler
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):  # items that depend on the epoch (`SampledPairs`)
            set_epoch(sampler.epoch)
        res = sampler._resume
        self._consumed = res["consumed"] if res is not None and res["epoch"] == sampler.epoch else 0
        for batch in super().__iter__():
            self._consumed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """{epoch, consumed (batches handed out this epoch), world_size, seed}."""
        return self.token_sampler.state_dict(consumed=self._consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration of `state['epoch']` yields only the batches not yet seen."""
        self.token_sampler.load_state_dict(state)
        self._consumed = int(state["consumed"])


def padded_length_array(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """(N,) lengths rounded up to a multiple of `multiple` (`collate.padded_length`, vectorised)."""
    return -(-np.asarray(lengths) // multiple) * multiple


def tensor_lengths(
    pairs: TokenizedPairs, multiple: int, scratch: Scratch
) -> tuple[np.ndarray, np.ndarray]:
    """(N,) source and (N,) target tensor lengths of `pairs`, rounded up to `multiple`, built
    a chunk at a time into scratch arrays (file-backed for large corpora: no N-sized copy
    in private memory)."""
    n = len(pairs)
    src, tgt = scratch.empty(n, np.int32), scratch.empty(n, np.int32)
    for a in range(0, n, _LENGTH_CHUNK):
        b = min(a + _LENGTH_CHUNK, n)
        s, t = pairs.src_lengths(a, b), pairs.tgt_lengths(a, b)
        if multiple > 1:  # budget the padded batch shapes the collate function will produce
            s, t = padded_length_array(s, multiple), padded_length_array(t, multiple)
        src[a:b], tgt[a:b] = s, t
    return src, tgt


def token_budget_loader(
    pairs: TokenizedPairs,
    *,
    pad_to_multiple: int,
    num_workers: int,
    pin_memory: bool,
    scratch_dir: str | Path | None = None,
    **sampling: Any,
) -> ResumableDataLoader:
    """Length-sorted batches of `pairs` under a token budget (`TokenBudgetBatchSampler`),
    collated with S and T padded to `pad_to_multiple` (the budget counts the padded lengths).

    Args:
        sampling: `TokenBudgetBatchSampler`'s max_tokens, batch_size, shuffle, bucket_pool
            and seed (it always sorts by length).
        pad_to_multiple: 1 = no rounding; else `collate`'s ``pad_to_multiple``.
        num_workers, pin_memory: see `torch.utils.data.DataLoader`. Workers persist across
            epochs, unless `pairs` has `set_epoch` (its items depend on the epoch, which
            reaches new workers only: `litmt.data.preparation.subword_sampling`). When its examples
            are redrawn per epoch (`redrawn_per_epoch`), each epoch is planned on the
            lengths of `pairs.at_epoch(epoch)`.
        scratch_dir: where the sampler's per-example arrays go as memory-mapped files when
            the split is large (`litmt.data.batching.scratch`); None = in memory.
    """
    m = pad_to_multiple
    src_lens, tgt_lens = tensor_lengths(pairs, m, Scratch(scratch_dir))
    redrawn = getattr(pairs, "redrawn_per_epoch", False)  # temperature sampling: `ResampledPairs`
    sampler = TokenBudgetBatchSampler(
        src_lens, tgt_lens, sort=True, scratch_dir=scratch_dir, **sampling,
        epoch_lengths=(lambda e: tensor_lengths(pairs.at_epoch(e), m, Scratch(scratch_dir)))
        if redrawn else None,
    )  # fmt: skip
    return ResumableDataLoader(
        pairs,
        batch_sampler=sampler,
        collate_fn=functools.partial(collate, pad_to_multiple=m) if m > 1 else collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0 and not hasattr(pairs, "set_epoch"),
    )
