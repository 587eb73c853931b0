"""Token-budget bucketing sampler: budgets, DDP partition, determinism, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from litmt.data import ResumableDataLoader, TokenBudgetBatchSampler, TokenizedPairs, collate
from litmt.data.batching.sampler import equalize, pack_batches
from litmt.errors import ConfigError


def lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(2, 60, n)


def plan(sampler_kwargs: dict, world: int, epoch: int = 0) -> list[list[list[int]]]:
    """Batches of each rank for one epoch."""
    out = []
    for rank in range(world):
        s = TokenBudgetBatchSampler(**sampler_kwargs, rank=rank, world_size=world)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n", [1003, 37, 5])
def test_ddp_partition_covers_each_example_once(world: int, shuffle: bool, n: int) -> None:
    src, tgt = lengths(n)
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300, "shuffle": shuffle, "seed": 7}
    ranks = plan(kw, world, epoch=3)
    counts = {len(r) for r in ranks}
    assert len(counts) == 1, f"unequal batch counts {[len(r) for r in ranks]}"
    seen = sorted(i for r in ranks for b in r for i in b)
    assert seen == list(range(n))  # every example exactly once, no duplicates
    for r in range(world):  # __len__ agrees with what is yielded
        assert len(TokenBudgetBatchSampler(**kw, rank=r, world_size=world)) == len(ranks[r])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fewer_examples_than_ranks_repeats_but_keeps_counts_equal(world: int) -> None:
    src, tgt = lengths(world - 1)
    ranks = plan({"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300}, world)
    assert {len(r) for r in ranks} == {1}
    assert set(i for r in ranks for b in r for i in b) == set(range(world - 1))


@pytest.mark.parametrize("max_tokens", [64, 300, 4096])
def test_token_budget_counts_padding(max_tokens: int) -> None:
    src, tgt = lengths(2000, seed=1)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=max_tokens, seed=0, rank=0, world_size=1)
    cost = np.maximum(src, tgt)
    for b in s:
        # padded size of the batch: sentences x longest of either side
        assert len(b) * cost[b].max() <= max_tokens or len(b) == 1
    # and it packs reasonably tightly: most batches are more than half full
    fill = [len(b) * cost[b].max() / max_tokens for b in s]
    assert np.median(fill) > 0.5


def test_single_overlong_example_is_alone() -> None:
    batches = pack_batches(np.arange(3), np.array([5, 50, 5]), max_tokens=20, batch_size=None)
    assert [b.tolist() for b in batches] == [[0], [1], [2]]


def test_sentence_batching() -> None:
    src, tgt = lengths(103)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=None, batch_size=10, rank=0, world_size=1)
    sizes = [len(b) for b in s]
    assert sum(sizes) == 103 and max(sizes) == 10
    with pytest.raises(ConfigError, match=r"set data.max_tokens or data.batch_size"):
        list(
            TokenBudgetBatchSampler(
                src, tgt, max_tokens=None, batch_size=None, world_size=1, rank=0
            )
        )


def test_bucketing_reduces_padding() -> None:
    rng = np.random.default_rng(2)
    src = rng.integers(1, 60, 5000)
    tgt = np.maximum(1, src + rng.integers(-3, 4, 5000))  # correlated, as in real corpora

    def padding(sort: bool) -> float:
        s = TokenBudgetBatchSampler(src, tgt, max_tokens=2000, sort=sort, rank=0, world_size=1)
        real = sum(int(src[b].sum() + tgt[b].sum()) for b in s)
        total = sum(len(b) * int(src[b].max() + tgt[b].max()) for b in s)
        return 1 - real / total

    assert padding(sort=True) < 0.1 < padding(sort=False)


def test_deterministic_per_seed_and_epoch() -> None:
    src, tgt = lengths(500)
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300, "seed": 5}
    assert plan(kw, 2, epoch=1) == plan(kw, 2, epoch=1)
    assert plan(kw, 2, epoch=1) != plan(kw, 2, epoch=2)
    assert plan(kw, 2, epoch=1) != plan({**kw, "seed": 6}, 2, epoch=1)


def test_constant_batch_count_across_epochs_with_whole_split_pool() -> None:
    src, tgt = lengths(3000)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=500, rank=0, world_size=1)
    counts = set()
    for epoch in range(5):
        s.set_epoch(epoch)
        counts.add(len(list(s)))
    assert len(counts) == 1


def test_finite_pool_still_partitions() -> None:
    src, tgt = lengths(2000)
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300, "bucket_pool": 4}
    ranks = plan(kw, 3)
    assert sorted(i for r in ranks for b in r for i in b) == list(range(2000))


def test_equalize_splits_largest_batches() -> None:
    batches = [np.arange(0, 4), np.arange(4, 6), np.arange(6, 7)]
    out = equalize(batches, 4)
    assert len(out) == 4 and sorted(np.concatenate(out).tolist()) == list(range(7))


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("stop", [0, 1, 4])
def test_resume_skips_exactly_the_seen_batches(world: int, stop: int) -> None:
    src, tgt = lengths(800)
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300, "seed": 2}
    for rank in range(world):
        full = TokenBudgetBatchSampler(**kw, rank=rank, world_size=world)
        full.set_epoch(1)
        expected = list(full)
        first = TokenBudgetBatchSampler(**kw, rank=rank, world_size=world)
        first.set_epoch(1)
        it = iter(first)
        seen = [next(it) for _ in range(stop)]
        state = first.state_dict()
        assert state["consumed"] == stop and state["epoch"] == 1
        resumed = TokenBudgetBatchSampler(**kw, rank=rank, world_size=world)
        resumed.load_state_dict(state)
        resumed.set_epoch(1)  # Lightning sets the same epoch again after loading
        rest = list(resumed)
        assert seen + rest == expected
        resumed.set_epoch(2)  # the next epoch is complete again
        assert len(list(resumed)) == len(resumed)


def test_resume_with_another_world_size_sees_the_rest_once() -> None:
    src, tgt = lengths(900)
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": 300, "seed": 4}
    seen = []
    state = None
    for rank in range(2):
        s = TokenBudgetBatchSampler(**kw, rank=rank, world_size=2)
        it = iter(s)
        seen += [i for _ in range(3) for i in next(it)]
        state = s.state_dict()
    rest = []
    counts = []
    for rank in range(3):
        s = TokenBudgetBatchSampler(**kw, rank=rank, world_size=3)
        s.load_state_dict(state)
        batches = list(s)
        counts.append(len(batches))
        rest += [i for b in batches for i in b]
    assert len(set(counts)) == 1
    assert sorted(seen + rest) == list(range(900))


def test_resume_with_another_seed_is_refused() -> None:
    src, tgt = lengths(50)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=300, seed=1, rank=0, world_size=1)
    state = s.state_dict()
    other = TokenBudgetBatchSampler(src, tgt, max_tokens=300, seed=2, rank=0, world_size=1)
    with pytest.raises(ConfigError, match=r"set data.seed=1"):
        other.load_state_dict(state)


def _loader(n: int, num_workers: int, **kw: object) -> ResumableDataLoader:
    src, tgt = lengths(n)
    ds = TokenizedPairs.from_lists([[5] * int(k) for k in src], [[6] * int(k - 1) for k in tgt])
    sampler = TokenBudgetBatchSampler(ds.src_lengths(), ds.tgt_lengths(), max_tokens=300, **kw)
    return ResumableDataLoader(
        ds, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_counts_batches_handed_out_not_prefetched(num_workers: int) -> None:
    """Workers make the sampler run ahead; the saved position is what training consumed."""
    kw = {"seed": 3, "rank": 0, "world_size": 1}
    full = [b["index"].tolist() for b in _loader(300, 0, **kw)]
    dl = _loader(300, num_workers, **kw)
    it = iter(dl)
    seen = [next(it)["index"].tolist() for _ in range(3)]
    state = dl.state_dict()
    assert state["consumed"] == 3
    del it
    dl2 = _loader(300, num_workers, **kw)
    dl2.load_state_dict(state)
    rest = [b["index"].tolist() for b in dl2]
    assert seen + rest == full
    assert len(dl2) == len(full)  # a full epoch's length, as Lightning expects


def test_lightning_sets_the_epoch_through_the_batch_sampler() -> None:
    dl = _loader(200, 0, seed=0, rank=0, world_size=1)
    _set_sampler_epoch(dl, 4)  # what Lightning's fit loop calls at each epoch start
    assert dl.batch_sampler.epoch == 4
    first = [b["index"].tolist() for b in dl]
    _set_sampler_epoch(dl, 5)
    assert [b["index"].tolist() for b in dl] != first


def test_reads_rank_from_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    src, tgt = lengths(30)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=100)
    assert (s.rank, s.world_size) == (2, 3)


def assert_walks_the_length_grid(order: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> None:
    """The documented rule of `bucket_sort`, checked on its output: costs max(src, tgt) never
    decrease; within one cost, src - tgt rises for even costs and falls for odd ones (a
    boustrophedon walk over the length grid)."""
    cost, diff = np.maximum(src[order], tgt[order]), src[order] - tgt[order]
    assert np.all(np.diff(cost) >= 0), "costs go down"
    for c in np.unique(cost):
        d = diff[cost == c]
        steps = np.diff(d) if c % 2 == 0 else -np.diff(d)
        assert np.all(steps >= 0), f"cost {c}: src - tgt runs the wrong way: {d.tolist()}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucket_sort_walks_the_length_grid_and_keeps_ties_in_input_order(seed: int) -> None:
    from litmt.data.batching.sampler import bucket_sort

    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(1, 9, 300), rng.integers(1, 9, 300)  # many equal (src, tgt) pairs
    order = rng.permutation(300)
    out = bucket_sort(order, src, tgt)
    assert sorted(out.tolist()) == list(range(300))  # a permutation of the input
    assert_walks_the_length_grid(out, src, tgt)
    rank_in_input = {int(i): r for r, i in enumerate(order)}
    for pair in {(int(a), int(b)) for a, b in zip(src, tgt, strict=True)}:
        same = [rank_in_input[int(i)] for i in out if (src[i], tgt[i]) == pair]
        assert same == sorted(same), f"ties of {pair} lost their (shuffled) input order"
    # a small case written out by hand: cost 1: (1,1); cost 2, rising src - tgt: (1,2) (2,2)
    # (2,1); cost 3, falling: (3,1) (3,3) (1,3)
    src_small, tgt_small = np.array([3, 2, 1, 2, 1, 3, 1]), np.array([3, 2, 3, 1, 2, 1, 1])
    assert bucket_sort(np.arange(7), src_small, tgt_small).tolist() == [6, 4, 1, 3, 5, 0, 2]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("pool", [None, 3])
def test_epochs_are_partitions_within_budget_deterministic_and_different(world, pool) -> None:
    """Properties of the sampler's order, independent of how it is produced: in every epoch
    each example comes exactly once and every batch keeps the token budget (padding counted);
    the same (seed, epoch) gives the same batches; another epoch or seed gives others."""
    src, tgt = lengths(700, seed=3)
    max_tokens = 256
    kw = {"src_lengths": src, "tgt_lengths": tgt, "max_tokens": max_tokens, "bucket_pool": pool}
    cost = np.maximum(src, tgt)
    plans = {}
    for seed in (11, 12):
        for epoch in (0, 1, 2):
            ranks = plan({**kw, "seed": seed}, world, epoch=epoch)
            assert sorted(i for r in ranks for b in r for i in b) == list(range(700))
            for batch in (b for r in ranks for b in r):
                assert len(batch) == 1 or len(batch) * cost[batch].max() <= max_tokens
            assert plan({**kw, "seed": seed}, world, epoch=epoch) == ranks  # a fresh sampler
            plans[seed, epoch] = ranks
    orders = [tuple(i for ranks in p for b in ranks for i in b) for p in plans.values()]
    assert len(set(orders)) == len(orders), "two (seed, epoch) pairs give the same order"
    first_batches = [tuple(p[0][0]) for p in plans.values()]  # rank 0's first batch
    assert len(set(first_batches)) == len(first_batches), "batches repeat across epochs/seeds"
