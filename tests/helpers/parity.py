"""Decode parity that holds on any x86 CPU: the tolerances, and the near-tie checks.

Two computations of the same model in float32 (the torch engine and CTranslate2, a batch of
one shape and of another, one thread or two, AVX-512, AVX2 or ATen's ``default`` kernels)
round differently: oneDNN/MKL pick their GEMM kernels by instruction set and thread count,
and CTranslate2 has its own. The same hypothesis then gets scores that differ in the last
bits, and a search that meets a near-tie may choose differently. On the tiny test models the
same hypothesis' log-probability differed by at most 3e-6 between engines (measured on AVX-512,
AVX2 and ``default``), and the smallest search margins of ordinary sentences are around 1e-4.

So parity tests compare *decisions* exactly where the decision is clear, and where two
computations disagree they check that the disagreement is a near-tie: both choices are worth
the same, within `NEAR_TIE`, under **both** computations. A real disagreement (an engine that
ignores the length penalty, a wrong budget) moves scores by far more and still fails.

Bit-for-bit equality stays where it must hold: resume against an uninterrupted run, DDP
against one process on the same machine, a kernel against itself.

The tolerances (`SCORE_ATOL`, `NEAR_TIE`) and the torch search's decision margins
(`search_margin`) live in `checks/decode_margins.py`, so the parity benchmarks use the same
numbers; they are imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from checks.decode_margins import (  # the tolerances and margins, shared with benchmarks/
    NEAR_TIE,
    SCORE_ATOL,
    search_margin,
    teacher_forced_log_probs,
)
from litmt.data.tokenization.tokenizer import EOS_ID


def ct2_step_log_prob(ct2_engine, src: Sequence[int], prefix: Sequence[int], token: int) -> float:
    """log P(token | prefix, src) under CTranslate2 (its `score_batch`, which appends eos)."""
    src_pieces = [ct2_engine._src_pieces[t] for t in src]
    if token == EOS_ID:
        res = ct2_engine.ct2.score_batch(
            [src_pieces], [[ct2_engine._tgt_pieces[t] for t in prefix]]
        )
        return float(res[0].log_probs[-1])
    target = [ct2_engine._tgt_pieces[t] for t in [*prefix, token]]
    return float(ct2_engine.ct2.score_batch([src_pieces], [target])[0].log_probs[-2])


@dataclass
class Divergence:
    """Where two greedy decodes of one sentence part: the shared prefix and the two tokens."""

    sentence: int
    prefix: list[int]
    tokens: tuple[int, int]
    gap_torch: float
    gap_ct2: float


def greedy_divergences(
    torch_engine, ct2_engine, sources: Sequence[Sequence[int]], ref, got
) -> list[Divergence]:
    """Every sentence whose greedy outputs differ, with the log-prob gap of the two tokens
    chosen at the first difference, under each engine (eos stands for an ended output)."""
    found = []
    for i, (src, a, b) in enumerate(zip(sources, ref, got, strict=True)):
        x, y = [*a[0].tokens, EOS_ID], [*b[0].tokens, EOS_ID]
        if x == y:
            continue
        t = next(j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)
        prefix, pair = x[:t], (x[t], y[t])
        logp = teacher_forced_log_probs(torch_engine, src, prefix)[-1]  # (V,)
        gap_torch = abs(float(logp[pair[0]] - logp[pair[1]]))
        gap_ct2 = abs(
            ct2_step_log_prob(ct2_engine, src, prefix, pair[0])
            - ct2_step_log_prob(ct2_engine, src, prefix, pair[1])
        )
        found.append(Divergence(i, prefix, pair, gap_torch, gap_ct2))
    return found


def assert_greedy_parity(torch_engine, ct2_engine, sources, ref, got) -> list[Divergence]:
    """Greedy outputs are identical, except at near-ties under both engines (returned)."""
    divergences = greedy_divergences(torch_engine, ct2_engine, sources, ref, got)
    real = [d for d in divergences if max(d.gap_torch, d.gap_ct2) > NEAR_TIE]
    assert not real, f"greedy outputs differ beyond a near-tie (NEAR_TIE={NEAR_TIE}): {real}"
    for a, b in zip(ref, got, strict=True):
        if a[0].tokens == b[0].tokens:
            assert b[0].log_prob == pytest.approx(a[0].log_prob, abs=SCORE_ATOL)
            assert b[0].score == pytest.approx(a[0].score, abs=SCORE_ATOL)
    return divergences


def assert_same_decisions(translator, sources: Sequence[Sequence[int]], ref, got, **options) -> int:
    """`ref` and `got` (per sentence: token lists, n-best lists or texts) are equal wherever
    the torch `translator`'s search on that source decides with a margin over `NEAR_TIE`.

    Returns how many sentences differ (each at a near-tie).
    """
    differ = 0
    for i, (src, a, b) in enumerate(zip(sources, ref, got, strict=True)):
        if a != b:
            margin = search_margin(translator, src, **options)
            assert margin <= NEAR_TIE, (
                f"sentence {i} decodes differently although the search margin is {margin:.2e}"
                f" > NEAR_TIE={NEAR_TIE}: {a!r} != {b!r}"
            )
            differ += 1
    return differ
