"""The parts of `litmt.deploy.engines.ct2_prefix` on their own (the engine against torch:
test_ct2_prefix_parity.py)."""

from __future__ import annotations

import logging

from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator_base import DecodeRequest
from litmt.deploy.engines.ct2_prefix import Call, distinct, finished_before_stop, plan_calls


def test_distinct_drops_repeats_and_blank_with_a_warning(caplog):
    found = [([5, 6], -1.0), ([5, 6], -1.0), ([5, PAD_ID], -2.0), ([5], -3.0)]
    with caplog.at_level(logging.WARNING, logger="litmt.deploy.engines.ct2_prefix"):
        assert distinct(found) == [([5, 6], -1.0), ([5], -3.0)]
    assert caplog.messages == ["dropped a CTranslate2 hypothesis holding <blank> (a replaced eos)"]


def test_finished_before_stop_keeps_what_litmt_holds_when_it_stops():
    """K = 3: litmt stops at the step of its 3rd finished hypothesis (n tokens: step n)."""
    found = [([1] * n, -float(n)) for n in (7, 4, 9, 4, 6)]
    assert [len(t) for t, _ in finished_before_stop(found, 3)] == [4, 4, 6]
    # prefix + eos finished elsewhere: the 2nd of these ends the search
    assert [len(t) for t, _ in finished_before_stop(found, 3, counted=1)] == [4, 4]
    assert finished_before_stop(found[:1], 3) == found[:1]  # the budget ended it first


def test_plan_calls_groups_by_budget_and_prefix_rule():
    config = DecodeConfig(beam_size=4, length_penalty=1.0, min_len=0)
    request = DecodeRequest(
        sources=[[7], [7], [7], [7]],
        todo=[0, 1, 2, 3],
        config=config,
        max_tokens=64,
        prefixes=[[5, 6], [], [5, 6, 8], [5]],
        constraints=None,
    )
    calls = plan_calls(request, [10, 10, 10, 12], blocked={2})
    assert calls == {
        Call(10, 0, False): [1],
        Call(10, 0, True): [0],
        Call(10, 4, True): [2],  # eos blocked right after its 3 prefix tokens
        Call(12, 0, True): [3],
    }
    options = Call(10, 4, True).search_options(config)
    assert options["patience"] == 11 and options["num_hypotheses"] == 44
    assert Call(10, 0, False).search_options(config)["num_hypotheses"] == 4
