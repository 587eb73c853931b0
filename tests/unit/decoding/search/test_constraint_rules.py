"""Terminology a translator can trust (issue 44): unknown characters are refused, each listed
occurrence must appear, the n-best holds only hypotheses that meet every constraint (else the
best one, flagged), glued forms („Hund“, (Hund), l'Hund) meet a constraint, and a beam
smaller than the constraint pieces + 1 is raised with one log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from tiny_checkpoint import corpus, tiny_checkpoint_path
from tiny_glued import glued_checkpoint_path

from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.decoding.search.beam import FinishedBuffer
from litmt.decoding.search.constraint_tracker import Tracker
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError, LitmtError

LEGACY_CT2 = Path(__file__).resolve().parents[3] / "fixtures" / "legacy_v0_1" / "ct2"


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint_path(tmp_path_factory), device="cpu")


def sentences(n: int) -> list[str]:
    return corpus(seed=2)[0][:n]


# -- 1. unknown pieces ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(constraints=[["Hund €"], None]),
            "the constraint (sentence 1) 'Hund €' has characters the model's target vocabulary "
            "lacks: '€'; they would be lost (<unk>): remove or replace them",
        ),
        (
            dict(prefixes=[None, "Ein ©"]),
            "the prefix (sentence 2) 'Ein ©' has characters the model's target vocabulary "
            "lacks: '©'; they would be lost (<unk>): remove or replace them",
        ),
    ],
)
def test_unknown_characters_are_refused_on_a_litmt_model(translator, kwargs, message):
    assert all(1 in ids for ids in translator.tokenizer.encode_tgt(["€", "©"]))  # <unk> here
    with pytest.raises(ConfigError) as err:
        translator.translate(["A red dog runs.", "A cat."], beam_size=3, **kwargs)
    assert str(err.value) == message
    assert isinstance(err.value, LitmtError)  # the scripts: exit 2; the server: 400


def test_unknown_characters_are_refused_on_an_imported_marian(tmp_path):
    """A piece vocabulary maps an unknown piece to <unk>, which Marian's decoding drops: the
    term would vanish from the output without a word."""
    pytest.importorskip("transformers")
    from benchmarks.hf_models import make_marian_dir
    from litmt.checkpoint.hf_import import read_marian_dir
    from litmt.models import Seq2SeqTransformer

    imported = read_marian_dir(make_marian_dir(tmp_path / "marian"))
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    marian = Translator(model, imported.tokenizer, device="cpu")
    assert marian.tokenizer.decode_tgt(marian.tokenizer.encode_tgt(["ein €"])) == ["ein"]
    lacks = "has characters the model's target vocabulary lacks: '€'; they would be lost"
    with pytest.raises(ConfigError) as err:
        marian.translate(["a dog"], beam_size=2, constraints=[["ein €"]])
    assert str(err.value).startswith(f"the constraint 'ein €' {lacks}")
    with pytest.raises(ConfigError) as err:
        marian.translate(["a dog"], beam_size=2, prefixes=["€ ein"])
    assert str(err.value).startswith(f"the prefix '€ ein' {lacks}")
    assert marian.translate(["a dog"], beam_size=2, constraints=[["ein"]])  # known: accepted


def test_unknown_characters_are_refused_on_the_ct2_engine():
    """The CTranslate2 engine encodes prefixes through the same check."""
    pytest.importorskip("ctranslate2")
    from litmt.deploy.engines.ct2 import CT2Translator

    ct2 = CT2Translator(LEGACY_CT2)
    with pytest.raises(ConfigError) as err:
        ct2.translate(["A man."], prefixes=["Ein €"])
    assert str(err.value) == (
        "the prefix 'Ein €' has characters the model's target vocabulary lacks: '€'; they would "
        "be lost (<unk>): remove or replace them"
    )
    assert ct2.translate(["A man."], prefixes=["Ein"])[0].startswith("Ein")


def test_byte_fallback_needs_an_exact_round_trip(tmp_path):
    """With byte fallback an unknown character becomes its bytes, not <unk>: accepted when the
    ids decode back to the phrase, refused when they do not."""
    path = tmp_path / "bf"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()[1]),
        model_prefix=str(path),
        vocab_size=300,
        byte_fallback=True,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    from litmt.decoding.steering import check_known_pieces

    tok = Tokenizer(path.with_suffix(".model").read_bytes())
    ids = tok.encode_tgt(["Hund €"])[0]
    assert 1 not in ids and tok.decode_tgt([ids]) == ["Hund €"]
    check_known_pieces(tok, "Hund €", ids, "constraint")  # accepted
    with pytest.raises(ConfigError) as err:
        check_known_pieces(tok, "Hund €", ids[:-1], "constraint")  # a byte lost
    assert str(err.value).startswith("the constraint 'Hund €' does not decode back to itself")


# -- 2. occurrences count -------------------------------------------------------------------
def test_each_listed_occurrence_must_appear(translator):
    en = sentences(6)
    for phrases in (["Mann", "Mann"], ["Hund", "Kater", "Hund"]):
        out = translator.translate(en, beam_size=4, constraints=[phrases] * len(en))
        for text in out:
            words = text.replace(".", " ").split()
            for p in set(phrases):
                assert words.count(p) >= phrases.count(p), (text, phrases)


def test_tracker_counts_occurrences_and_glues_only_after_glue():
    from litmt.decoding.search.constraint_tracker import WordPieces

    tr = Tracker([[5], [5]])
    one = tr.advance(tr.start, 5)
    assert not tr.done(one) and tr.completed(tr.start, one) and tr.bank(one) == 1
    assert tr.done(tr.advance(one, 5)) and tr.total == 2
    # phrase 9 5 (▁Hund as ▁ + Hund), glued form 5 (Hund): only after a glue piece (7: „)
    words = WordPieces(torch.zeros(10, dtype=torch.bool), frozenset({7}), {(9, 5): (5,)})
    tr = Tracker([[9, 5]], words)
    state = tr.advance(tr.start, 8)  # a letter: "...xHund" is not the word
    assert not tr.done(tr.advance(state, 5)) and 5 not in tr.wanted(state)
    state = tr.advance(state, 7)  # „
    assert 5 in tr.wanted(state) and tr.done(tr.advance(state, 5))
    assert tr.done(tr.advance(tr.advance(tr.start, 9), 5))  # the ▁ form anywhere


# -- 3. n-best honesty ----------------------------------------------------------------------
def test_nbest_holds_only_hypotheses_meeting_every_constraint(translator):
    """A budget of exactly the constraint tokens makes many hypotheses end unmet; the n-best
    list shows none of them."""
    en = sentences(8)
    cons = [["Vogel"], ["heute", "Kater"], ["alter Mann"], ["hier"]] * 2
    out = translator.translate(
        en, beam_size=4, n_best=4, constraints=cons, max_len_a=0.0, max_len_b=0, return_scores=True
    )
    for hyps, phrases in zip(out, cons, strict=True):
        assert hyps
        for text, _ in hyps:
            assert all(p in text for p in phrases), (text, phrases)


def test_no_hypothesis_meeting_them_gives_the_best_one_flagged(translator):
    found = translator.translations(
        ["A red dog runs.", ""], beam_size=3, constraints=[["Hund"], ["Vogel"]]
    )
    assert found[0][0].constraints_met and "Hund" in found[0][0].text
    assert [(t.text, t.constraints_met) for t in found[1]] == [("", False)]  # empty source
    # the buffer of a search where nothing met its constraints: its best one, flagged
    buf = FinishedBuffer(torch.tensor([3]), k=3, alpha=0.0, dtype=torch.float64)
    history = torch.tensor([[9, 10], [11, 12]])
    not_final = torch.zeros((1, 2), dtype=torch.bool)
    logp = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)
    buf.add(torch.tensor([0]), logp, history, torch.tensor([[0, 1]]), not_final)
    (best,) = buf.best(3, final_only=True)
    assert [(h.tokens, h.constraints_met) for h in best] == [([11, 12], False)]
    assert [h.constraints_met for h in buf.best(3)[0]] == [True, True]  # plain search


# -- 4. glued forms -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def glued(tmp_path_factory) -> Translator:
    return Translator.from_checkpoint(glued_checkpoint_path(tmp_path_factory), device="cpu")


def test_glue_pieces_and_glued_forms(glued):
    tok = glued.tokenizer
    (heute,) = tok.encode_tgt(["heute"])
    words = glued.word_pieces([[heute]])
    assert words.glued == {tuple(heute): tuple(tok.tgt.piece_to_id(["heute"]))}
    glue = set(tok.tgt_pieces(sorted(words.glue)))
    assert {"▁„", "(", "'", "▁"} <= glue
    assert not glue & {".", ",", ")", "▁."}, glue  # no word starts glued to these
    assert not any(p[-1].isalnum() for p in glue), glue


@pytest.mark.parametrize("glue", ["„", "(", '"', "l'"])
def test_a_constraint_is_met_by_its_glued_form(glued, glue):
    """Where the model writes the word glued to „ ( " or l', the constraint is that word: the
    output keeps it once, glued, as the unconstrained search writes it."""
    en = {"„": '"{}"', "(": "({})", '"': "'{}'", "l'": "to {}"}[glue]
    places = {"today": "heute", "here": "hier", "outside": "draußen"}
    subjects = [("red", "dog", "runs"), ("old", "man", "sleeps"), ("small", "cat", "eats")]
    src = [f"A {a} {n} {v} {en.format(p)}." for a, n, v in subjects for p in places]
    terms = [[places[p]] for _ in subjects for p in places]
    plain = glued.translate(src, beam_size=4)
    assert all(f"{glue}{t[0]}" in p for p, t in zip(plain, terms, strict=True)), plain
    steered = glued.translate(src, beam_size=4, constraints=terms)
    for text, (term,) in zip(steered, terms, strict=True):
        assert text.count(term) == 1 and f"{glue}{term}" in text, (text, term)
    assert steered == plain


# -- 5. beam sizing -------------------------------------------------------------------------
def test_a_small_beam_is_raised_to_the_constraint_pieces_plus_one(translator, caplog):
    en = sentences(4)
    cons = [["alter Mann", "heute"]] * 4
    pieces = sum(len(c) for c in translator.tokenizer.encode_tgt(cons[0]))
    assert pieces + 1 > 3
    with caplog.at_level(logging.INFO, logger="litmt"):
        raised = translator.translate(en, beam_size=3, constraints=cons, return_scores=True)
    lines = [r.getMessage() for r in caplog.records if "constraint pieces" in r.getMessage()]
    assert lines == [
        f"beam size 3 is smaller than the constraint pieces + 1 of 4 sentence(s): their beams "
        f"are raised to fit (up to {pieces + 1})"
    ]
    same = translator.translate(en, beam_size=pieces + 1, constraints=cons, return_scores=True)
    assert raised == same
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="litmt"):
        translator.translate(en, beam_size=pieces + 1, constraints=cons)
    assert not [r for r in caplog.records if "constraint pieces" in r.getMessage()]
