"""The ct2 engine with a target prefix gives the torch engine's n-best (`litmt.deploy.engines.ct2_prefix`).

The engines run the committed legacy fixture (`tests/fixtures/legacy_v0_1`: a checkpoint and
its CTranslate2 export with fixed weights), so the cases that CTranslate2's own prefix rules
decide differently stay put. Each case is chosen by what the torch engine does (the rank of
eos right after the prefix, its 1-best), never by what the ct2 engine does.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from parity import SCORE_ATOL, assert_parity, teacher_forced_log_probs
from tiny_checkpoint import corpus

from litmt.data.tokenization.tokenizer import EOS_ID, PAD_ID
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator

pytestmark = pytest.mark.parity

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "legacy_v0_1"
EN, DE = corpus(seed=3)


@pytest.fixture(scope="module")
def engines() -> tuple[Translator, CT2Translator]:
    torch_engine = Translator.from_checkpoint(FIXTURE / "tiny.ckpt", device="cpu")
    return torch_engine, CT2Translator(FIXTURE / "ct2", threads=1)


def _encode(engine: Translator, pairs: list[tuple[str, str]]) -> tuple[list, list]:
    """Source ids and prefix ids of (source, prefix) pairs."""
    prefixes, _ = engine.encode_steering(len(pairs), [p for _, p in pairs])
    return [engine.prepare(s) for s, _ in pairs], prefixes


def _lists(found) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in found]


def _assert_same_decisions(torch_engine, ids, ref, got, options, best_only=False):
    """n-best lists (or 1-bests) equal by the parity rule (`parity.assert_parity`: a few
    sentences may part at a near-tie of the torch search); equal lists score equally."""
    if best_only:
        ref, got = [a[:1] for a in ref], [b[:1] for b in got]
    assert_parity(torch_engine, ids, ref, got, **options)


def _assert_same_scores(ref, got) -> None:
    for a, b in zip(ref, got, strict=True):
        for x, y in zip(a, b, strict=True):
            assert y.log_prob == pytest.approx(x.log_prob, abs=SCORE_ATOL)
            assert y.score == pytest.approx(x.score, abs=SCORE_ATOL)


def test_a_budget_equal_to_the_prefix_gives_the_prefix_once(engines):
    """CTranslate2 registers every beam at the last step: K copies of the prefix."""
    torch_engine, ct2_engine = engines
    ids, prefixes = _encode(torch_engine, [(EN[i], DE[i]) for i in range(8)])
    options = dict(beam_size=3, n_best=3, max_len_a=0.0, max_len_b=0)  # budget = len(prefix)
    ref = torch_engine.search_ids(ids, prefixes=prefixes, **options)
    got = ct2_engine.search_ids(ids, prefixes=prefixes, **options)
    assert _lists(got) == _lists(ref) == [[p] for p in prefixes]
    _assert_same_scores(ref, got)


def test_eos_ranked_below_first_after_the_prefix_never_comes_back_as_blank(engines, caplog):
    """A budget of len(prefix) + 1 where eos ranks 2nd or 3rd after the prefix (beam 3):
    CTranslate2 turns that eos into ``<blank>`` (id 0); the engine returns torch's list."""
    torch_engine, ct2_engine = engines
    pairs = [
        (EN[j], " ".join(DE[k].split()[:n])) for j in range(12) for k in range(12) for n in (2, 5)
    ]
    ids, prefixes = _encode(torch_engine, pairs)
    cases: dict[int, list[int]] = defaultdict(list)  # prefix length -> cases
    for i, (src, prefix) in enumerate(zip(ids, prefixes, strict=True)):
        logp = teacher_forced_log_probs(torch_engine, src, prefix)[-1]  # (V,) after the prefix
        if 1 <= int((logp > logp[EOS_ID]).sum()) < 3:
            cases[len(prefix)].append(i)
    assert sum(map(len, cases.values())) >= 5  # the fixture holds such cases
    with caplog.at_level(logging.WARNING, logger="litmt.deploy.engines.ct2_prefix"):
        for length, idx in cases.items():
            options = dict(beam_size=3, n_best=3, max_len_a=0.0, max_len_b=length + 1)
            src, pre = [ids[i] for i in idx], [prefixes[i] for i in idx]
            ref = torch_engine.search_ids(src, prefixes=pre, **options)
            got = ct2_engine.search_ids(src, prefixes=pre, **options)
            assert not any(PAD_ID in h.tokens for hyps in got for h in hyps)
            _assert_same_decisions(torch_engine, src, ref, got, options)
    assert not caplog.records  # no <blank> had to be dropped: eos was blocked, not replaced


@pytest.mark.parametrize(("beam_size", "length_penalty"), [(3, 1.0), (4, 0.6), (5, 1.5)])
def test_a_complete_sentence_as_prefix_gets_the_same_one_best(engines, beam_size, length_penalty):
    """Where torch's best is ``prefix + eos`` (the prefix is a whole sentence), so is ct2's."""
    torch_engine, ct2_engine = engines
    sources = [s for s in EN[:50] if s.split()[3] == "sleeps"]  # short outputs: eos comes early
    ids, prefixes = _encode(torch_engine, [(s, d) for s in sources for d in DE[:50]])
    options = dict(beam_size=beam_size, length_penalty=length_penalty)
    ref = torch_engine.search_ids(ids, prefixes=prefixes, **options)
    done = [i for i, (hyps, p) in enumerate(zip(ref, prefixes, strict=True)) if hyps[0].tokens == p]
    assert len(done) > 100
    ids, prefixes = [ids[i] for i in done], [prefixes[i] for i in done]
    got = ct2_engine.search_ids(ids, prefixes=prefixes, **options)
    ref = [ref[i] for i in done]
    _assert_same_decisions(torch_engine, ids, ref, got, options, best_only=True)


def test_n_best_lists_match_torch_wherever_the_search_is_clear(engines):
    """Three kinds of prefix (2 words, half, the whole reference) and another sentence's
    reference, beam 5, n_best 3: identical lists except at a near-tie of the torch search."""
    torch_engine, ct2_engine = engines
    pairs = []
    for i in range(30):
        words = DE[i].split()
        pairs += [(EN[i], " ".join(words[:2])), (EN[i], " ".join(words[: len(words) // 2]))]
        pairs += [(EN[i], DE[i]), (EN[i], DE[i + 1])]
    ids, prefixes = _encode(torch_engine, pairs)
    options = dict(beam_size=5, n_best=3, length_penalty=1.0, max_len_b=40)  # budget not hit
    ref = torch_engine.search_ids(ids, prefixes=prefixes, **options)
    got = ct2_engine.search_ids(ids, prefixes=prefixes, **options)
    _assert_same_decisions(torch_engine, ids, ref, got, options)
