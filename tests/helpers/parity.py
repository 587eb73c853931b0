"""Decode parity that holds on any x86 CPU: the tolerances, and the near-tie checks.

Two computations of the same model in float32 (the torch engine and CTranslate2, a batch of
one shape and of another, one thread or two, AVX-512, AVX2 or ATen's ``default`` kernels)
round differently: oneDNN/MKL pick their GEMM kernels by instruction set and thread count,
and CTranslate2 has its own. The same hypothesis then gets scores that differ in the last
bits, and a search that meets a near-tie may choose differently. On the tiny test models the
same hypothesis' log-probability differed by at most 3e-6 between engines (measured on AVX-512,
AVX2 and ``default``), and the smallest search margins of ordinary sentences are around 1e-4.

So parity tests compare *decisions*, with one rule (`assert_parity`): two outputs of a
sentence may differ only where they part at a near-tie of the reference, measured there from
the reference's own log-probabilities (`parting_gap`): the two next tokens of the shared prefix
are worth the same within `NEAR_TIE`, or the two whole hypotheses score the same within it (a
ranking tie: the finished hypotheses were ordered differently). And only a few sentences may:
at most `EXCUSE_CAP` of a comparison (at least one). A real disagreement (an engine that
ignores the length penalty, a budget off by one, eos blocked a step late, a language tag
dropped) parts at a clear decision and fails, however few sentences it touches.

Bit-for-bit equality stays where it must hold: resume against an uninterrupted run, DDP
against one process on the same machine, a kernel against itself.

The tolerances (`SCORE_ATOL`, `NEAR_TIE`, `EXCUSE_CAP`) and the rule itself (`parting_gaps`,
`compare_outputs`) live in `checks/decode_margins.py`, so the parity checks of ``checks/``
apply the same rule; `assert_parity` asserts it here (tests/unit/test_parity_rule.py tests it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from checks.decode_margins import (  # the rule and its tolerances, shared with checks/
    EXCUSE_CAP,
    NEAR_TIE,
    SCORE_ATOL,
    compare_outputs,
    max_excused,
    teacher_forced_log_probs,
)
from litmt.data.tokenization.tokenizer import EOS_ID
from litmt.decoding.search.rules import Hypothesis


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


@dataclass
class Parity:
    """What `assert_parity` found: the sentences compared and, for each that differs at a
    near-tie, the reference's gap where its outputs part."""

    n: int
    gaps: dict[int, float]

    @property
    def differ(self) -> int:
        return len(self.gaps)


def assert_parity(translator, sources: Sequence[Sequence[int]], ref, got, **options) -> Parity:
    """`ref` and `got` (per sentence: a text, a token list, an n-best list of token lists or of
    `Hypothesis`) are equal, except for sentences whose outputs part at a near-tie of the torch
    `translator` (`parting_gap` <= `NEAR_TIE` at the first rank where the lists differ), and
    those are at most `max_excused` of them. Equal `Hypothesis` lists must score equally.

    Args:
        options: the comparison's decoding options; ``length_penalty`` is the ranking's alpha.
    """
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        pairs = list(zip(_scored(a), _scored(b), strict=False))
        if pairs and all(h.tokens == k.tokens for h, k in pairs):
            for h, k in pairs:
                assert k.log_prob == pytest.approx(h.log_prob, abs=SCORE_ATOL), f"sentence {i}"
                assert k.score == pytest.approx(h.score, abs=SCORE_ATOL), f"sentence {i}"
    found = compare_outputs(
        translator, sources, ref, got, float(options.get("length_penalty", 1.0))
    )
    assert not found.real, (
        f"sentences differ where the reference decides clearly (gap > NEAR_TIE={NEAR_TIE}): "
        + "; ".join(f"sentence {i} (gap {g:.2e}) {found.parted[i]}" for i, g in found.real.items())
    )
    cap = max_excused(found.n)
    assert len(found.near_ties) <= cap, (
        f"{len(found.near_ties)} of {found.n} sentences differ at near-ties, more than the cap "
        f"of {cap} (EXCUSE_CAP={EXCUSE_CAP}): {sorted(found.near_ties)}"
    )
    return Parity(found.n, found.near_ties)


def _scored(item: Any) -> list[Hypothesis]:
    """The `Hypothesis` objects of one sentence's output (none for texts and token lists)."""
    if isinstance(item, Hypothesis):
        return [item]
    if isinstance(item, str) or not isinstance(item, Sequence):
        return []
    return [h for h in item if isinstance(h, Hypothesis)]
