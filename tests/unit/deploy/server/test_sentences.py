"""The server's sentence splitter: units within the model's limit, texts rebuilt exactly."""

from __future__ import annotations

import pytest

pytest.importorskip("sentencex", reason="the serve extra is not installed")

from litmt.deploy.server.errors import ApiError
from litmt.deploy.server.input.sentences import Segmenter, split_sentences
from litmt.errors import ConfigError


def words(strings: list[str]) -> list[int]:
    """A stand-in token count: one token per whitespace-separated word."""
    return [len(s.split()) for s in strings]


@pytest.mark.parametrize(
    ("lang", "text", "n"),
    [
        ("en", "A man sleeps.  Dr. Smith waits! Is it raining? Yes, e.g. today.", 4),
        ("de", "Ein Mann steht am 3. Mai vor dem Haus. Er trägt z. B. einen Hut.", 2),
        ("cs", "Muž stojí u auta. Žena sedí.", 2),
        ("fr", "  Un homme marche. Une femme court.  ", 2),
        ("en", "no boundary at all", 1),
        ("en", "", 1),
    ],
)
def test_split_keeps_every_character_and_finds_the_sentences(lang, text, n):
    parts = split_sentences(text, lang)
    assert "".join(a + s + b for a, s, b in parts) == text
    assert len(parts) == n
    assert all(s == s.strip() for _, s, _ in parts)


def test_only_lines_over_the_limit_are_split_and_texts_are_rebuilt():
    seg = Segmenter("en", mode="long", count=words, model_limit=5)
    texts = [
        "A cat sleeps. A dog runs fast.",
        "Short one.\nCats ran home. Dogs ran away. Birds sang songs.",
    ]
    plan = seg.plan(texts)
    assert plan.units == [
        "A cat sleeps.",
        "A dog runs fast.",
        "Short one.",
        "Cats ran home.",
        "Dogs ran away.",
        "Birds sang songs.",
    ]
    assert seg.split_lines == 2
    upper = plan.join([u.upper() for u in plan.units])
    assert upper == [
        "A CAT SLEEPS. A DOG RUNS FAST.",
        "SHORT ONE.\nCATS RAN HOME. DOGS RAN AWAY. BIRDS SANG SONGS.",
    ]


def test_nbest_joins_each_units_jth_or_last_hypothesis():
    seg = Segmenter("en", mode="always", count=words, model_limit=50)
    plan = seg.plan(["One. Two.", "Three."])
    found = [["1a", "1b"], ["2a"], ["3a", "3b", "3c"]]
    assert plan.join_nbest(found) == [
        ["1a 2a", "1b 2a", "1b 2a"],
        ["3a", "3b", "3c"],
    ]


def test_a_sentence_over_the_limit_is_refused_never_truncated():
    seg = Segmenter("en", mode="long", count=words, model_limit=3)
    with pytest.raises(ApiError) as err:
        seg.plan(["Dogs run. Cats walk slowly over the hill."])
    assert err.value.status == 413
    assert err.value.message == (
        "Invalid request: a sentence has 6 source tokens, over the model's limit (3)"
    )
    never = Segmenter("en", mode="never", count=words, model_limit=3)
    with pytest.raises(ApiError, match=r"a line has 5 .* \(3\); set split_sentences=long"):
        never.plan(["Dogs run. Cats walk on."])


def test_the_request_limit_counts_the_units():
    seg = Segmenter("en", mode="long", count=words, model_limit=10, request_limit=7)
    assert seg.plan(["a b c", "d e f g"]).units == ["a b c", "d e f g"]
    with pytest.raises(ApiError, match=r"8 source tokens, over the limit \(max_source_tokens=7\)"):
        seg.plan(["a b c", "d e f g h"])


def test_without_a_tokenizer_lines_are_the_units():
    plan = Segmenter("en", count=None).plan(["A. B.\nC."])
    assert plan.units == ["A. B.", "C."] and plan.join(["x", "y"]) == ["x\ny"]


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(
        ConfigError,
        match=r"split_sentences must be one of \['long', 'always', 'never'\], got 'auto'",
    ):
        Segmenter("en", mode="auto")
