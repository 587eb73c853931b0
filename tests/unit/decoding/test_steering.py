"""Target prefixes and terminology constraints on the tiny model: the prefix is forced
decoding of the prefix, constraints are always met (multi-piece, overlapping), batches equal
one-at-a-time decoding, and bad input is one line."""

from __future__ import annotations

import pytest
import torch
from tiny_checkpoint import corpus, tiny_checkpoint_path

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID
from litmt.decoding.analysis.forced import ForcedDecoder
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.constraint_tracker import Tracker
from litmt.decoding.search.dispatch import decode
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint_path(tmp_path_factory), device="cpu")


def sentences(n: int, seed: int = 2) -> tuple[list[str], list[str]]:
    en, de = corpus(seed=seed)
    return en[:n], de[:n]


def _src(translator: Translator, texts: list[str]) -> torch.Tensor:
    ids = [translator.prepare(t) for t in texts]
    src = torch.zeros((len(ids), max(map(len, ids))), dtype=torch.long)  # pad = 0
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    return src


# -- prefix ---------------------------------------------------------------------------------
@pytest.mark.parametrize("beam_size", [1, 4])
def test_prefix_is_forced_decoding_of_the_prefix(translator, beam_size):
    """The output starts with the prefix ids, and its log-probability is the model's on those
    ids (ForcedDecoder on the whole output: the prefix part is scored as forced decoding)."""
    en, de = sentences(12)
    prefixes = [" ".join(d.split()[:2]) for d in de[:6]] + ["Ein alter Vogel"] * 3 + [None] * 3
    pids, _ = translator.encode_steering(len(en), prefixes)
    ids = [translator.prepare(s) for s in en]
    found = translator.search_ids(ids, beam_size=beam_size, prefixes=pids)
    forced = ForcedDecoder(translator).force_decode_ids(ids, [h[0].tokens for h in found])
    for p, hyps, f in zip(pids, found, forced, strict=True):
        assert hyps[0].tokens[: len(p)] == p
        assert hyps[0].log_prob == pytest.approx(f.log_prob, abs=1e-4)
        assert hyps[0].score == pytest.approx(f.score, abs=1e-4)
    texts = translator.translate(en, beam_size=beam_size, prefixes=prefixes)
    assert all(t.startswith(p) for t, p in zip(texts, prefixes, strict=True) if p)


def test_prefix_part_scores_like_forced_decoding_of_the_prefix_alone(translator):
    """Greedy with a prefix: the output's log-probability is the teacher-forced sum over its
    steps, the prefix steps being forced decoding of the prefix ids."""
    en, de = sentences(4)
    for src_text, ref in zip(en, de, strict=True):
        prefix = translator.tokenizer.encode_tgt([" ".join(ref.split()[:2])])[0]
        src = [translator.prepare(src_text)]
        out = translator.search_ids(src, beam_size=1, prefixes=[prefix])[0][0]
        assert out.tokens[: len(prefix)] == prefix
        full = ForcedDecoder(translator).force_decode_ids(src, [out.tokens])[0].log_prob
        src_t = torch.tensor(src)  # (1, S)
        tgt_in = torch.tensor([[BOS_ID, *out.tokens]])  # (1, T)
        with torch.no_grad():  # teacher-forced log-probs of every step, (T, V)
            logp = torch.log_softmax(translator.model(src_t, tgt_in)[0].float(), -1)
        gold = [*out.tokens, EOS_ID]
        per_step = [float(logp[t, gold[t]]) for t in range(len(gold))]
        prefix_part = sum(per_step[: len(prefix)])  # forced decoding of the prefix ids
        assert prefix_part < 0.0
        assert out.log_prob == pytest.approx(prefix_part + sum(per_step[len(prefix) :]), abs=1e-4)
        assert full == pytest.approx(out.log_prob, abs=1e-4)


def test_prefix_equal_to_the_reference_reproduces_it(translator):
    en, de = sentences(20)
    for beam_size in (1, 4):
        assert translator.translate(en, beam_size=beam_size, prefixes=de) == de
    # even where the reference is longer than the budget: the budget holds the prefix
    out = translator.translate(en[:3], beam_size=3, prefixes=de[:3], max_len_a=0.0, max_len_b=2)
    assert out == de[:3]


def test_mixed_prefix_batch_equals_one_at_a_time(translator):
    en, _ = sentences(10)
    prefixes = [None, "Ein", "", "Ein alter", None, "Ein kleiner Kater", None, "Ein", "E", None]
    for options in (dict(beam_size=1), dict(beam_size=4, n_best=2)):
        batch = translator.translate(en, prefixes=prefixes, return_scores=True, **options)
        alone = [
            translator.translate([s], prefixes=[p], return_scores=True, **options)[0]
            for s, p in zip(en, prefixes, strict=True)
        ]
        assert [[t for t, _ in h] for h in batch] == [[t for t, _ in h] for h in alone]


def test_no_prefix_and_no_constraints_is_the_default_path(translator):
    en, _ = sentences(8)
    src = _src(translator, en)
    for config in (DecodeConfig(beam_size=4, n_best=2), DecodeConfig(method="greedy")):
        plain = decode(translator.model, src, config)
        steered = decode(translator.model, src, config, prefixes=[[]] * 8, constraints=[[]] * 8)
        assert [[(h.tokens, h.score) for h in r] for r in plain] == [
            [(h.tokens, h.score) for h in r] for r in steered
        ]


def test_sampling_keeps_the_prefix(translator):
    en, _ = sentences(4)
    out = translator.translate(en, method="sample", n_best=3, prefixes=["Ein alter"] * 4)
    assert all(t.startswith("Ein alter") for hyps in out for t, _ in hyps)


# -- constraints ----------------------------------------------------------------------------
def _pieces(translator: Translator, phrase: str) -> int:
    return len(translator.tokenizer.encode_tgt([phrase])[0])


def test_constraints_are_always_met(translator):
    """Every constraint appears, for phrases of several pieces, for two overlapping ones and
    for words the model would not produce for that source."""
    en, _ = sentences(12)
    overlap = ["roter Hund", "Hund rennt"]  # "roter Hund rennt" meets both
    assert _pieces(translator, "roter Hund") > 2  # spans several pieces
    constraints = [
        overlap,
        ["heute"],
        ["Kater", "draußen"],
        ["großer Vogel"],
        ["schläft"],
        ["junger"],
        overlap,
        ["singt", "hier"],
        ["alter Mann"],
        ["Vogel"],
        ["isst"],
        ["kleiner Junge", "heute"],
    ]
    for beam_size in (1, 4):
        out = translator.translate(en, beam_size=beam_size, constraints=constraints)
        for text, phrases in zip(out, constraints, strict=True):
            for c in phrases:
                assert c in text, (text, c)
    out = translator.translate(en[:2], beam_size=4, constraints=[overlap, overlap])
    assert all("roter Hund rennt" in t or t.count("Hund") >= 2 for t in out)


def test_constraints_with_a_prefix_and_n_best(translator):
    en, _ = sentences(4)
    found = translator.translate(
        en,
        beam_size=4,
        n_best=3,
        prefixes=["Ein alter"] * 4,
        constraints=[["heute"], ["Vogel"], [], ["roter Hund"]],
    )
    for hyps, c in zip(found, [["heute"], ["Vogel"], [], ["roter Hund"]], strict=True):
        assert hyps and all(t.startswith("Ein alter") for t, _ in hyps)
        assert all(all(p in t for p in c) for t, _ in hyps)


def test_mixed_constraint_batch_equals_one_at_a_time(translator):
    en, _ = sentences(8)
    constraints = [[], ["heute"], ["roter Hund", "Hund rennt"], [], ["Kater"], ["singt", "hier"]]
    constraints += [[], ["alter Mann"]]
    options = dict(beam_size=4, n_best=2, return_scores=True)
    batch = translator.translate(en, constraints=constraints, **options)
    alone = [
        translator.translate([s], constraints=[c], **options)[0]
        for s, c in zip(en, constraints, strict=True)
    ]
    assert [[t for t, _ in h] for h in batch] == [[t for t, _ in h] for h in alone]
    for a, b in zip(batch, alone, strict=True):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)
    # sentences without constraints: the ordinary beam search (scores to float rounding of
    # another batch shape)
    plain = translator.translate(en, **options)
    for i, c in enumerate(constraints):
        if not c:
            assert [t for t, _ in batch[i]] == [t for t, _ in plain[i]]
            assert [s for _, s in batch[i]] == pytest.approx([s for _, s in plain[i]], abs=1e-4)


def test_tracker_follows_overlaps_and_partial_matches():
    tr = Tracker([[5, 6, 7], [7, 8], [5, 5, 9]])
    state = tr.start
    for token in (5, 5, 6, 7):  # 5 5 6 7: the partial 5 5 falls back to 5, then 5 6 7
        state = tr.advance(state, token)
    # [5, 6, 7] met once; [7, 8] has its first token; [5, 5, 9] was broken by 6
    assert state.phrases == ((1, 0), (0, 1), (0, 0))
    assert tr.bank(state) == 3 + 1
    assert tr.wanted(state) == {8, 7, 5}
    after = tr.advance(state, 8)
    assert tr.completed(state, after) and not tr.done(after)
    assert tr.bank(after) == 3 + 2


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(prefixes="Ein"), "prefixes must be a list with one string (or null) per sentence"),
        (dict(prefixes=["Ein"]), "prefixes has 1 entries for 2 sentences"),
        (dict(prefixes=[3, None]), "a prefix must be a string (sentence 1), got int"),
        (dict(constraints=["Hund", "Kater"]), "must be a list of strings (sentence 1), got str"),
        (dict(constraints=[[""], None]), "a constraint must not be empty (sentence 1)"),
        (dict(constraints=[[1], None]), "a constraint must be a string (sentence 1), got int"),
        (
            dict(constraints=[["Hund " * 30], None]),
            "constraints (sentence 1) need 120 target tokens, more than",
        ),
        (
            dict(prefixes=["Ein " * 60, None]),
            "(sentence 1) need 180 target tokens, more than the model's maximum output of 47",
        ),
        (dict(constraints=[["Hund"], None], method="sample"), "constraints need beam search"),
    ],
)
def test_bad_prefixes_and_constraints_are_one_line_errors(translator, kwargs, message):
    with pytest.raises(ConfigError) as err:
        translator.translate(["A red dog runs.", "A cat."], **kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_constraint_ends_a_word(translator):
    """The model would extend "Hun" to "Hund"; after a completed constraint, pieces that
    continue a word are blocked (`Translator.word_pieces`), so "Hun" stays a word."""
    en, _ = sentences(6)
    out = translator.translate(en, beam_size=4, constraints=[["Hun"]] * 6)
    for text in out:
        assert "Hun" in text.rstrip(".").split(), text
    # a prefix that extends a constraint's word is forced as it is
    out = translator.translate(
        en[:2], beam_size=4, prefixes=["Ein Hund"] * 2, constraints=[["Hun"]] * 2
    )
    assert all(t.startswith("Ein Hund") for t in out), out
    mask = translator.word_pieces().continuation
    pieces = translator.tokenizer.tgt_pieces(range(len(mask)))
    assert not any(m and p.startswith("\u2581") for m, p in zip(mask, pieces, strict=True))
