"""A leading OPUS-MT language token (``>>fra<<``) reaches every unit the server's splitter
makes of a text; blank lines stay blank, and a line with its own token keeps it."""

from __future__ import annotations

import pytest

pytest.importorskip("sentencex", reason="the serve extra is not installed")

from litmt.deploy.server.input.sentences import Segmenter, inline_token


def test_inline_token_is_read_as_the_piece_vocabulary_reads_it():
    assert inline_token(">>fra<< A dog.") == ">>fra<<"
    assert inline_token(">>zho_Hans<<") == ">>zho_Hans<<"
    for text in (" >>fra<< A dog.", "A >>fra<< dog.", ">> fra << A dog.", ""):
        assert inline_token(text) is None


def test_every_sentence_and_line_carries_the_token_and_the_text_is_rebuilt():
    texts = [">>fra<< A dog runs. It is wet.\nA cat sleeps.\n\n>>deu<< One. Two.", "Plain. Text."]
    plan = Segmenter("en", mode="always").plan(texts)
    assert plan.units == [
        ">>fra<< A dog runs.", ">>fra<< It is wet.", ">>fra<< A cat sleeps.", "",
        ">>deu<< One.", ">>deu<< Two.", "Plain.", "Text.",
    ]  # fmt: skip
    out = [u.replace(">>fra<< ", "FR:").replace(">>deu<< ", "DE:") for u in plan.units]
    assert plan.join(out) == [
        "FR:A dog runs. FR:It is wet.\nFR:A cat sleeps.\n\nDE:One. DE:Two.",
        "Plain. Text.",
    ]


def test_lines_whole_carry_the_token_too():
    plan = Segmenter("en", mode="never").plan([">>fra<< A dog runs. It is wet.\nA cat."])
    assert plan.units == [">>fra<< A dog runs. It is wet.", ">>fra<< A cat."]
