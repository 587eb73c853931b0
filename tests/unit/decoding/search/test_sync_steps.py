"""Decoding in lock step (``sync_steps``): under FSDP every decoder call all-gathers weights, so
ranks whose sentences finish at different steps must still call `decode_step` equally often.

Two gloo ranks on the CPU decode with a model whose every `decode_step` runs a collective (as
FSDP's all-gather does); rank 0 has short sources (a small budget), rank 1 long ones.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_model import tiny_config
from train_utils import free_port, start_method

from litmt.decoding.search.beam import beam_search
from litmt.decoding.search.greedy import greedy_search
from litmt.models import Seq2SeqTransformer

VOCAB = 40
BUDGET = dict(max_len_a=1.0, max_len_b=2)  # a source of n tokens may produce n + 2
DEADLINE_S = 120.0


class CollectiveModel:
    """A `StepModel` that runs one all-reduce per `decode_step` (None: no collective, the
    single-process reference) and counts its decoder calls."""

    def __init__(self, model: Seq2SeqTransformer, collective: bool) -> None:
        self.model, self.config, self.collective, self.calls = model, model.config, collective, 0

    def encode(self, src: torch.Tensor) -> Any:
        return self.model.encode(src)

    def init_state(self, memory: Any, mask: torch.Tensor | None, capacity: int | None = None):
        return self.model.init_state(memory, mask, capacity=capacity)

    def decode_step(self, tokens: torch.Tensor, state: Any) -> torch.Tensor:
        self.calls += 1
        if self.collective:
            dist.all_reduce(torch.ones(1))  # stands for FSDP's all-gather of a layer's weights
        return self.model.decode_step(tokens, state)


def make_model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB)).eval()


def rank_sources(rank: int) -> torch.Tensor:
    """Rank 0: three 2-token sources (budget 4); rank 1: three 12-token sources (budget 14)."""
    g = torch.Generator().manual_seed(rank)
    return torch.randint(4, VOCAB, (3, 2 if rank == 0 else 12), generator=g)


def run_searches(model: CollectiveModel, src: torch.Tensor, **sync: bool) -> dict[str, Any]:
    """Greedy then beam-3 (n_best 2): tokens, scores and decoder calls of each."""
    out: dict[str, Any] = {}
    model.calls = 0
    greedy = greedy_search(model, src, **BUDGET, **sync)
    out["greedy"] = [[h.tokens, round(h.score, 5)] for h in greedy]
    out["greedy_calls"], model.calls = model.calls, 0
    beam = beam_search(model, src, beam_size=3, n_best=2, **BUDGET, **sync)
    out["beam"] = [[[h.tokens, round(h.score, 5)] for h in hyps] for hyps in beam]
    out["beam_calls"] = model.calls
    return out


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = CollectiveModel(make_model(), collective=True)
        result = run_searches(model, rank_sources(rank), sync_steps=True)
        Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # as a trainer's next collective: a rank still decoding never meets it
    finally:
        dist.destroy_process_group()


def join_or_kill(context: mp.ProcessContext, deadline_s: float) -> None:
    """Join the ranks; on the deadline kill them and fail (a collective left unmatched)."""
    end = time.monotonic() + deadline_s
    while not context.join(timeout=max(0.1, end - time.monotonic())):
        if time.monotonic() >= end:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the ranks did not finish within {deadline_s:.0f} s (a hang)")


def test_two_gloo_ranks_decode_in_lock_step_like_one_process(tmp_path: Path) -> None:
    reference = [
        run_searches(CollectiveModel(make_model(), collective=False), rank_sources(r))
        for r in (0, 1)
    ]
    # the premise: alone, the ranks' searches stop after different numbers of steps
    assert reference[0]["greedy_calls"] < reference[1]["greedy_calls"]
    assert reference[0]["beam_calls"] < reference[1]["beam_calls"]

    context = mp.start_processes(
        _worker,
        args=(2, free_port(), str(tmp_path)),
        nprocs=2,
        join=False,
        start_method=start_method(),
    )
    join_or_kill(context, DEADLINE_S)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for key in ("greedy_calls", "beam_calls"):  # lock step: as often as the longest rank
        assert got[0][key] == got[1][key] == reference[1][key]
    for r in (0, 1):  # the hypotheses of the unsynchronised search
        assert got[r]["greedy"] == reference[r]["greedy"]
        assert got[r]["beam"] == reference[r]["beam"]


def test_without_a_process_group_sync_steps_is_off_and_runs_no_collective() -> None:
    model = CollectiveModel(make_model(), collective=False)
    assert not dist.is_initialized()
    plain = run_searches(model, rank_sources(1))
    assert plain == run_searches(model, rank_sources(1), sync_steps=False)
