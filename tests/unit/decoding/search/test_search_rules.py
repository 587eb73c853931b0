"""What every search shares (`litmt.decoding.search.rules`): the argument checks (the same
one-line errors from every search), the per-sentence budgets and the rules a step applies
(min_len, eos at the budget, prefixes), and the GNMT score of a hypothesis."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_model import tiny_config

from litmt.data.tokenization.tokenizer import EOS_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.beam import beam_search
from litmt.decoding.search.constrained import constrained_search
from litmt.decoding.search.greedy import greedy_search
from litmt.decoding.search.rules import (
    Hypothesis,
    StepRules,
    all_done,
    check_search_args,
    loop_steps,
)
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

VOCAB = 12


@pytest.fixture(scope="module")
def model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB, max_positions=16)).eval()


SRC = torch.tensor([[4, 5, 6], [7, 0, 0]])  # lengths 3 and 1


def _unchecked(options: dict) -> DecodeConfig:
    """A DecodeConfig carrying `options` as given, past its own validation (as a caller
    building one by hand could): the search must check them itself."""
    config = DecodeConfig()
    for key, value in options.items():
        object.__setattr__(config, key, value)
    return config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_len": -1}, "min_len must be >= 0, got -1"),
        ({"beam_size": 0}, "beam_size must be at least 1, got 0"),
        ({"beam_size": 2, "n_best": 3}, "n_best must be between 1 and beam_size=2, got 3"),
        ({"beam_size": 7}, "beam_size=7 is too large for a target vocabulary of 12"),
    ],
)
def test_every_beam_search_raises_the_same_one_line_errors(model, kwargs, message):
    """The plain and the constrained beam search check their arguments in one function."""
    full = {"min_len": 0, "beam_size": 2, **kwargs}
    with pytest.raises(ConfigError) as direct:
        check_search_args(model, SRC, **full)
    with pytest.raises(ConfigError) as plain:
        beam_search(model, SRC, **full)
    with pytest.raises(ConfigError) as constrained:
        constrained_search(model, SRC, [[[8]], []], _unchecked(full), beam_size=full["beam_size"])
    assert str(direct.value) == str(plain.value) == str(constrained.value) == message


def test_source_checks(model):
    with pytest.raises(
        ConfigError, match="source of 17 tokens exceeds the model's max_positions=16"
    ):
        greedy_search(model, torch.ones((1, 17), dtype=torch.long))
    with pytest.raises(ValueError, match=r"src must be \(B, S\) token ids, got shape \(3,\)"):
        check_search_args(model, torch.ones(3, dtype=torch.long), min_len=0)
    check_search_args(model, SRC, min_len=0)  # no beam: no beam checks
    check_search_args(model, SRC, min_len=0, beam_size=6, n_best=6)  # 2K = V is allowed


def test_budgets_hold_the_prefix_and_the_constraints(model):
    """floor(a * src_len + b), raised to len(prefix) + the constraints' tokens."""
    rules = StepRules.build(model, SRC, 1.0, 1, min_len=0)
    assert rules.budget.tolist() == [4, 2] and rules.steps == 5
    assert rules.force_steps == {4, 2} and rules.prefix is None
    rules = StepRules.build(model, SRC, 1.0, 1, 0, [[5], [5, 6, 7]], [[], [[8, 9]]])
    assert rules.budget.tolist() == [4, 5] and rules.steps == 6
    assert loop_steps(rules, sync_steps=False, device=SRC.device) == 6
    with pytest.raises(ConfigError, match="more than the model's maximum output of 15"):
        StepRules.build(model, SRC, 1.0, 1, 0, [[5] * 16, []])


def finite(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero()[:, 0].tolist()


def test_step_rules_apply_min_len_the_budget_and_the_prefix(model):
    """Rows 0, 1 decode sentence 0 (budget 4, prefix [5, 6]), rows 2, 3 sentence 1 (budget 2,
    no prefix); min_len 2."""
    rules = StepRules.build(model, SRC, 1.0, 1, 2, [[5, 6], []])
    sentence = torch.tensor([0, 0, 1, 1])
    everything = list(range(VOCAB))
    no_eos = [t for t in everything if t != EOS_ID]

    def step(n: int) -> list[list[int]]:
        logp = torch.zeros((4, VOCAB))
        rules.apply(logp, n, sentence)
        return [finite(row) for row in logp]

    assert step(0) == [[5], [5], no_eos, no_eos]  # the prefix; no eos before min_len
    assert step(1) == [[6], [6], no_eos, no_eos]
    assert step(2) == [everything, everything, [EOS_ID], [EOS_ID]]  # sentence 1 at its budget
    assert step(3) == [everything] * 4
    assert step(4) == [[EOS_ID], [EOS_ID], everything, everything]


def test_min_len_above_the_budget_leaves_no_token_at_the_budget(model):
    """The search still ends there (`test_search`: the budget wins over min_len)."""
    rules = StepRules.build(model, SRC, 0.0, 1, min_len=5)
    logp = torch.zeros((2, VOCAB))
    rules.apply(logp, 1, torch.tensor([0, 1]))
    assert finite(logp[0]) == finite(logp[1]) == []


def test_hypothesis_gnmt_score_counts_eos():
    h = Hypothesis.normalised([4, 5, 6], -2.0, alpha=1.0)
    assert h.tokens == [4, 5, 6] and h.log_prob == -2.0
    assert h.score == pytest.approx(-2.0 / ((5 + 4) / 6))
    assert Hypothesis.normalised([], -2.0, alpha=0.0).score == -2.0
    assert math.isinf(Hypothesis.normalised([4], -math.inf, alpha=1.0).score)


def test_all_done_without_sync_steps_is_this_ranks_answer():
    device = torch.device("cpu")
    assert all_done(True, False, device) and not all_done(False, False, device)
