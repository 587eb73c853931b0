"""The parts of a beam step (`litmt.decoding.search.beam_parts`), each on hand-made numbers: the score
update, the finished buffer (GNMT ranking, final before not final, full / beats, best-n),
the stop test and the state rows; and dynamic beam allocation of the constrained search."""

from __future__ import annotations

import math

import pytest
import torch

from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.decoding.search.beam import FinishedBuffer, beam_done, beam_rows, update_scores
from litmt.decoding.search.constrained import allocate
from litmt.decoding.search.rules import NEG_INF

INF = math.inf


def lp(n: int, alpha: float) -> float:
    return ((5.0 + n) / 6.0) ** alpha


def test_update_scores_adds_each_beams_score_in_place_with_beam_major_layout():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [-0.5, -0.5, NEG_INF], [0, 0, 0]])
    scores = torch.tensor([[10.0, 20.0], [-1.0, -2.0]])  # (b=2, kk=2)
    cand = update_scores(logp, scores)
    assert cand.shape == (2, 6)
    assert cand.tolist() == [
        [9.0, 8.0, 7.0, 16.0, 15.0, 14.0],
        [-1.5, -1.5, -INF, -2.0, -2.0, -2.0],
    ]
    assert logp[0, 0] == 9.0  # in place: the caller's tensor holds the cumulative scores


def history() -> torch.Tensor:
    """(R=3, t=2): the tokens of three live rows."""
    return torch.tensor([[5, 6], [7, 8], [9, 10]])


def test_finished_buffer_ranks_by_gnmt_score_and_keeps_k():
    """Candidates of t tokens are scored log P / lp(t + 1); the K best stay, best first, with
    their tokens from their history row, their length, and pad after it."""
    alpha = 1.0
    buf = FinishedBuffer(torch.tensor([4, 2]), k=2, alpha=alpha)
    assert buf.width == 5 and buf.lp_max.tolist() == pytest.approx([lp(5, alpha), lp(3, alpha)])
    # sentence 1 gets three candidates (rows 0, 1, 2 of the history), sentence 0 none
    log_prob = torch.tensor([[-3.0, -1.0, -2.0]])
    buf.add(torch.tensor([1]), log_prob, history(), torch.tensor([[0, 1, 2]]))
    assert buf.score[1].tolist() == pytest.approx([-1.0 / lp(3, alpha), -2.0 / lp(3, alpha)])
    assert buf.log_prob[1].tolist() == [-1.0, -2.0]
    assert buf.length[1].tolist() == [2, 2]
    assert buf.tokens[1].tolist() == [
        [7, 8, PAD_ID, PAD_ID, PAD_ID],
        [9, 10, PAD_ID, PAD_ID, PAD_ID],
    ]
    assert buf.score[0].tolist() == [NEG_INF, NEG_INF]  # untouched
    # a longer hypothesis (3 tokens) with a lower log P wins under alpha = 1: -1.1 / lp(4)
    longer = torch.tensor([[5, 6, 7]])
    buf.add(torch.tensor([1]), torch.tensor([[-1.1]]), longer, torch.tensor([[0]]))
    assert -1.1 / lp(4, alpha) > -1.0 / lp(3, alpha)
    assert buf.log_prob[1].tolist() == pytest.approx([-1.1, -1.0])
    assert buf.length[1].tolist() == [3, 2]
    assert [h.tokens for h in buf.best(2)[1]] == [[5, 6, 7], [7, 8]]


def test_finished_buffer_keeps_the_order_of_arrival_on_ties():
    buf = FinishedBuffer(torch.tensor([3]), k=2, alpha=0.0)
    buf.add(torch.tensor([0]), torch.tensor([[-1.0]]), history(), torch.tensor([[0]]))
    buf.add(torch.tensor([0]), torch.tensor([[-1.0, -1.0]]), history(), torch.tensor([[1, 2]]))
    assert [h.tokens for h in buf.best(2)[0]] == [[5, 6], [7, 8]]  # the buffer's own first


def test_a_hypothesis_that_is_not_final_ranks_last_and_does_not_count():
    """A constrained hypothesis that missed a constraint (final False) ranks below every final
    one whatever its score, and neither fills the buffer nor beats the live beams."""
    buf = FinishedBuffer(torch.tensor([3]), k=2, alpha=0.0, dtype=torch.float64)
    final = torch.tensor([[False, True]])
    buf.add(torch.tensor([0]), torch.tensor([[-0.1, -5.0]], dtype=torch.float64), history(),
            torch.tensor([[0, 1]]), final)  # fmt: skip
    assert buf.final[0].tolist() == [True, False]
    assert buf.log_prob[0].tolist() == [-5.0, -0.1]
    sent = torch.tensor([0])
    assert not buf.full(sent).item()
    high = torch.tensor([-100.0], dtype=torch.float64)  # any live beam is far worse
    assert buf.beats(sent, high, n_best=1).item()
    assert not buf.beats(sent, high, n_best=2).item()  # one final hypothesis, not two
    buf.add(sent, torch.tensor([[-9.0]], dtype=torch.float64), history(), torch.tensor([[2]]))
    assert buf.full(sent).item()
    assert [h.log_prob for h in buf.best(2)[0]] == [-5.0, -9.0]  # the unmet one fell out


def test_finished_buffer_best_returns_fewer_when_fewer_finished():
    buf = FinishedBuffer(torch.tensor([3, 3]), k=3, alpha=0.0)
    buf.add(torch.tensor([0]), torch.tensor([[-1.0, NEG_INF]]), history(), torch.tensor([[2, 0]]))
    best = buf.best(3)
    assert [len(b) for b in best] == [1, 0]
    assert best[0][0].tokens == [9, 10] and best[0][0].score == -1.0


def test_finished_buffer_skips_a_merge_without_candidates_on_cpu():
    buf = FinishedBuffer(torch.tensor([3]), k=1, alpha=0.0)
    buf.add(torch.tensor([0]), torch.tensor([[-1.0]]), history(), torch.tensor([[0]]))
    before = [t.clone() for t in (buf.score, buf.log_prob, buf.length, buf.tokens, buf.final)]
    buf.add(
        torch.tensor([0]), torch.tensor([[NEG_INF, NEG_INF]]), history(), torch.tensor([[1, 2]])
    )
    after = (buf.score, buf.log_prob, buf.length, buf.tokens, buf.final)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def done(buf: FinishedBuffer, best_live: list[float], at_budget: list[bool], step: int, n_best=1):
    sent = torch.arange(len(best_live))
    out = beam_done(buf, sent, torch.tensor(best_live), torch.tensor(at_budget), step, n_best)
    return out.tolist()


def test_stop_test_conditions():
    """Done: K final (a), the n_best-th final beats what a live beam can reach (b), at the
    budget (c), no live beam (d); otherwise not."""
    alpha = 1.0
    buf = FinishedBuffer(torch.tensor([10, 10, 10, 10]), k=2, alpha=alpha)
    hist, rows = history(), torch.tensor([[0, 1]])
    buf.add(torch.tensor([0]), torch.tensor([[-1.0, -2.0]]), hist, rows)  # full
    buf.add(torch.tensor([1]), torch.tensor([[-1.0, NEG_INF]]), hist, rows)  # one finished
    # sentence 1: its finished score -1 / lp(3) against a live beam at -1.9 that could reach
    # -1.9 / lp(11) at best (alpha > 0: lp grows to the budget's)
    assert -1.0 / lp(3, alpha) < -1.9 / lp(11, alpha)  # so sentence 1 goes on ...
    assert done(buf, [-1.9] * 4, [False] * 4, step=2) == [True, False, False, False]
    # ... and stops once its best live beam has fallen far enough
    assert -1.0 / lp(3, alpha) >= -4.0 / lp(11, alpha)
    assert done(buf, [-9.0, -4.0, -9.0, NEG_INF], [False, False, True, False], step=2) == [
        True, True, True, True,
    ]  # fmt: skip
    # n_best = 2 needs two final hypotheses before (b) can hold
    assert done(buf, [-9.0, -40.0, -9.0, -9.0], [False] * 4, step=2, n_best=2) == [
        True, False, False, False,
    ]  # fmt: skip


def test_stop_test_without_length_penalty_uses_the_next_steps_lp():
    """alpha <= 0: lp shrinks or stays with length, so the most favourable is the next step's."""
    alpha = -0.5
    buf = FinishedBuffer(torch.tensor([10]), k=2, alpha=alpha)
    buf.add(torch.tensor([0]), torch.tensor([[-1.0, NEG_INF]]), history(), torch.tensor([[0, 1]]))
    fin = -1.0 / lp(3, alpha)  # two tokens and eos
    step = 4  # the next step's hypotheses have step + 2 tokens with eos
    # by hand, GNMT's lp(n) = ((5 + n) / 6) ** alpha: lp(6) = (11 / 6) ** -0.5 = sqrt(6 / 11)
    assert lp(step + 2, alpha) == pytest.approx(0.7385489, abs=1e-7)
    live = fin * lp(step + 2, alpha)  # reaches fin at the next step
    assert done(buf, [live - 1e-3], [False], step) == [True]
    # not done, though lp(budget + 1) = lp(11) (smaller here) would have said so
    lp_budget = lp(10 + 1, alpha)
    assert lp_budget < lp(step + 2, alpha) and (live + 1e-3) / lp_budget < fin
    assert done(buf, [live + 1e-3], [False], step) == [False]


def test_beam_rows():
    rows = beam_rows(torch.tensor([0, 2]), 3, torch.tensor([[2, 0], [1, 1]]))
    assert rows.tolist() == [2, 0, 7, 7]


def test_dynamic_beam_allocation_takes_the_best_of_every_bank_first():
    """(bank, log-prob, beam, token, state): ranked within their bank, then by rank, higher
    bank first; so bank 2's lone candidate is kept although bank 0 has better ones."""
    live = [
        (0, -1.0, 0, 5, (0,)),
        (0, -1.5, 0, 6, (0,)),
        (0, -2.0, 1, 7, (0,)),
        (1, -3.0, 1, 8, (1,)),
        (2, -9.0, 0, 9, (2,)),
        (1, -2.5, 0, 10, (1,)),
    ]
    chosen = allocate(live, 4)
    assert [c[3] for c in chosen] == [9, 10, 5, 8]
    assert [c[3] for c in allocate(live, 2)] == [9, 10]
    assert allocate([], 3) == []


def test_stop_test_of_the_constrained_search():
    """`constrained=True`: K final hypotheses do not stop a sentence whose live beam could
    still beat them, and a live beam is scored as if it finished at the next step (alpha > 0:
    not at the budget's length)."""
    alpha = 1.0
    buf = FinishedBuffer(torch.tensor([10]), k=2, alpha=alpha)
    buf.add(torch.tensor([0]), torch.tensor([[-9.0, -10.0]]), history(), torch.tensor([[0, 1]]))
    sent, budget = torch.tensor([0]), torch.tensor([False])

    def stop(live: float, constrained: bool) -> bool:
        return beam_done(buf, sent, torch.tensor([live]), budget, 2, 1, constrained).item()

    assert stop(-0.5, constrained=False)  # K final: done
    assert not stop(-0.5, constrained=True)  # a live beam far better than both
    # best final -9 / lp(3); a live beam at -14 reaches -14 / lp(11) at the budget (better),
    # but -14 / lp(4) at the next step (worse): the constrained search stops
    assert -14 / lp(11, alpha) > -9 / lp(3, alpha) > -14 / lp(4, alpha)
    assert stop(-14.0, constrained=True)
    # n_best 2: the second final, -10 / lp(3), must beat it too: not against -11 / lp(4)
    assert beam_done(buf, sent, torch.tensor([-11.0]), budget, 2, 1, True).item()
    assert not beam_done(buf, sent, torch.tensor([-11.0]), budget, 2, 2, True).item()
