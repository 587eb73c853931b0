"""The parity rule (`checks.decode_margins`, asserted by `parity.assert_parity`): two outputs
may differ only where they part at a near-tie of the reference, measured there, and only for
a few sentences. A reference model with hand-set log-probabilities shows both sides of every
line of it: a true near-tie is excused, a real difference never is, and the cap bites.

Shapes: T target positions, V vocabulary.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from parity import assert_parity

from checks.decode_margins import (
    EXCUSE_CAP,
    NEAR_TIE,
    compare_outputs,
    max_excused,
    parting_gap,
    parting_gaps,
)
from litmt.data.tokenization.tokenizer import EOS_ID

V = 10
A, B, C = 5, 6, 7  # three content tokens


class TableModel(torch.nn.Module):
    """log P(next | prefix): A and B tie within `gap` after bos, C follows either, then eos."""

    def __init__(self, gap: float) -> None:
        super().__init__()
        self.gap = gap

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        rows = []
        for t in range(tgt.size(1)):
            logits = torch.full((V,), -20.0)
            if t == 0:  # after bos: A or B
                logits[A], logits[B] = 0.0, -self.gap
            elif t == 1:  # after A or B: C much more likely than eos
                logits[C], logits[EOS_ID] = 0.0, -3.0
            else:
                logits[EOS_ID] = 0.0
            rows.append(logits.log_softmax(-1))
        return torch.stack(rows)[None]  # (1, T, V)


def reference(gap: float) -> SimpleNamespace:
    return SimpleNamespace(model=TableModel(gap), device="cpu", tokenizer=None)


SRC = [4, 5, 6]


def test_the_gap_is_measured_where_the_outputs_part() -> None:
    near, far = reference(NEAR_TIE / 2), reference(0.5)
    step, _ = parting_gaps(near, SRC, [A, C], [B, C])
    assert step == pytest.approx(NEAR_TIE / 2, rel=1e-3)
    step, ranking = parting_gaps(far, SRC, [A, C], [B, C])
    assert step == pytest.approx(0.5, rel=1e-3)
    assert ranking == pytest.approx(0.5 / ((5 + 3) / 6), rel=1e-3)  # GNMT lp(3), alpha 1
    assert parting_gap(far, SRC, [A, C], [B, C]) == pytest.approx(ranking)
    assert parting_gap(far, SRC, [A, C], [A, C]) == 0.0
    # A then eos against A then C: they part at eos vs C, a gap of 3 nats
    assert parting_gaps(far, SRC, [A], [A, C])[0] == pytest.approx(3.0, rel=1e-3)


def test_a_true_near_tie_is_excused_and_counted() -> None:
    ref = [[A, C]] + [[A, C]] * 39
    got = [[B, C]] + [[A, C]] * 39
    found = compare_outputs(reference(NEAR_TIE / 2), [SRC] * 40, ref, got)
    assert found.ok and list(found.near_ties) == [0] and not found.real
    assert assert_parity(reference(NEAR_TIE / 2), [SRC] * 40, ref, got).differ == 1


def test_a_real_difference_is_never_excused() -> None:
    ref, got = [[A, C]] * 40, [[B, C]] + [[A, C]] * 39
    found = compare_outputs(reference(0.5), [SRC] * 40, ref, got)
    assert not found.ok and list(found.real) == [0]
    with pytest.raises(AssertionError, match=r"sentence 0 \(gap 3.75e-01\) rank 0"):
        assert_parity(reference(0.5), [SRC] * 40, ref, got)


def test_a_budget_off_by_one_is_a_real_difference() -> None:
    """The reference stops after C; an engine whose budget cut the output one token early
    parts at eos against C, a clear decision."""
    with pytest.raises(AssertionError, match="gap > NEAR_TIE"):
        assert_parity(reference(0.5), [SRC] * 20, [[A, C]] * 20, [[A]] + [[A, C]] * 19)


def test_the_cap_bites() -> None:
    n = 100
    cap = max_excused(n)
    assert cap == int(EXCUSE_CAP * n) and max_excused(3) == 1
    ref = [[A, C]] * n
    at_cap = [[B, C]] * cap + [[A, C]] * (n - cap)
    over = [[B, C]] * (cap + 1) + [[A, C]] * (n - cap - 1)
    near = reference(NEAR_TIE / 2)
    assert assert_parity(near, [SRC] * n, ref, at_cap).differ == cap
    with pytest.raises(AssertionError, match=f"{cap + 1} of {n} sentences differ at near-ties"):
        assert_parity(near, [SRC] * n, ref, over)


def test_n_best_lists_part_at_their_first_differing_rank() -> None:
    near = reference(NEAR_TIE / 2)
    found = compare_outputs(near, [SRC], [[[A, C], [B, C]]], [[[A, C], [B]]])
    assert list(found.real) == [0]  # rank 1: [B, C] against [B]: C against eos, clear
    tie = compare_outputs(near, [SRC], [[[A, C], [B, C]]], [[[B, C], [A, C]]])
    assert list(tie.near_ties) == [0]  # rank 0 parts at A against B: a near-tie
    cut = compare_outputs(near, [SRC], [[[A, C], [B, C]]], [[[A, C]]])
    assert cut.real == {0: math.inf}  # an n-best list cut short is never a near-tie


class TableSteps:
    """`TableModel` as a step model (``encode``, ``decode_step``), as an engine without a
    torch model (``engine=onnx``) has one: the state is the target prefix so far."""

    def __init__(self, gap: float) -> None:
        self.table = TableModel(gap)

    def encode(self, src: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        return [], src.eq(0)

    def decode_step(self, tokens: torch.Tensor, state: list[int]) -> torch.Tensor:
        state.append(int(tokens[0]))
        logp = self.table(torch.tensor([SRC]), torch.tensor([state]))[0, -1]  # (V,)
        return logp[None] + 7.0  # (1, V): logits, not normalised


def test_a_step_model_reference_measures_the_same_gaps() -> None:
    """The rule measured by decoder steps (the page's benchmark against python onnxruntime)
    gives the torch forward pass's gaps."""
    for gap in (NEAR_TIE / 2, 0.5):
        steps = SimpleNamespace(model=None, step_model=TableSteps(gap), tokenizer=None)
        for a, b in (([A, C], [B, C]), ([A], [A, C])):
            want = parting_gaps(reference(gap), SRC, a, b)
            assert parting_gaps(steps, SRC, a, b) == pytest.approx(want, abs=1e-6)
