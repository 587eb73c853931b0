"""Directions at decoding time (`litmt.decoding.languages`): the language token reaches the
model on its side (ids checked), unknown and zero-shot directions are refused with one
line, and a one-pair checkpoint behaves as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import build_tiny_multilingual_checkpoint, tiny_checkpoint_path

from litmt.decoding.translator import Translator
from litmt.errors import ConfigError

EN = ["A red dog runs.", "A small cat sleeps here.", ""]


@pytest.fixture(scope="module", params=["source", "target"])
def multi(request, tmp_path_factory) -> tuple[str, Path]:
    placement = request.param
    directory = tmp_path_factory.mktemp(f"multi_{placement}")
    return placement, build_tiny_multilingual_checkpoint(directory, placement)


def _spy(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []
    inner = translator.search_ids

    def search_ids(sources, config=None, **kwargs):
        calls.append({"sources": [list(s) for s in sources], "prefixes": kwargs.get("prefixes")})
        return inner(sources, config, **kwargs)

    monkeypatch.setattr(translator, "search_ids", search_ids)
    return calls


def test_checkpoint_records_directions(multi) -> None:
    placement, path = multi
    meta = torch.load(path, weights_only=True)["litmt"]
    assert meta["directions"] == ["en-de", "en-fr"]
    assert meta["tag_placement"] == placement
    translator = Translator.from_checkpoint(path, device="cpu")
    assert translator.languages.targets_of("en") == ["de", "fr"]


def test_the_tag_reaches_the_model(multi, monkeypatch: pytest.MonkeyPatch) -> None:
    placement, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    calls = _spy(translator, monkeypatch)
    tok = translator.tokenizer
    plain = [translator.prepare(s) for s in EN]
    for lang in ("de", "fr"):
        out = translator.translate(EN, src_lang="en", tgt_lang=lang)
        assert out[2] == "" and not any("<2" in t for t in out)  # the token is not text
        tag = tok.src_tags[f"<2{lang}>"]
        call = calls.pop()
        if placement == "source":
            assert call["sources"][:2] == [[tag, *p] for p in plain[:2]]
            assert call["sources"][2] == []  # an empty line stays empty
            assert call["prefixes"] is None
        else:
            assert call["sources"] == plain
            assert call["prefixes"] == [[tag]] * 3
    # a user prefix follows the forced token
    translator.translate(EN[:1], src_lang="en", tgt_lang="fr", prefixes=["Un"])
    call = calls.pop()
    want = tok.encode_tgt(["Un"])[0]
    if placement == "target":
        assert call["prefixes"] == [[tok.tgt_tags["<2fr>"], *want]]
    else:
        assert call["prefixes"] == [want]


def test_the_model_learned_both_directions(multi) -> None:
    _, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    de = translator.translate(EN[:2], tgt_lang="de", beam_size=1)
    fr = translator.translate(EN[:2], tgt_lang="fr", beam_size=1)
    assert de != fr  # the token steers the output language


def test_unknown_directions_are_refused_with_one_line(multi, caplog) -> None:
    _, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    cases = [
        ({"tgt_lang": "cs"}, "this model translates en-de, en-fr, not en-cs"),
        ({"src_lang": "xx", "tgt_lang": "de"}, "this model translates en-de, en-fr, not xx-de"),
        ({}, "this model translates en-de, en-fr; say which with tgt_lang=XX"),
        (
            {"src_lang": "de", "tgt_lang": "fr"},
            "de-fr was never trained (the model translates en-de, en-fr); pass "
            "allow_zero_shot=true to try it zero-shot",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError) as info:
            translator.translate(EN[:1], **kwargs)
        assert str(info.value) == message
        assert "\n" not in str(info.value)
    with caplog.at_level(logging.WARNING, logger="litmt"):
        out = translator.translate(EN[:1], src_lang="de", tgt_lang="fr", allow_zero_shot=True)
    assert len(out) == 1
    assert "de-fr is zero-shot" in caplog.text
    route = translator.route("de", "fr", allow_zero_shot=True)
    assert route.zero_shot and route.tgt_lang == "fr"


def test_a_one_pair_checkpoint_is_unchanged(tmp_path_factory) -> None:
    translator = Translator.from_checkpoint(tiny_checkpoint_path(tmp_path_factory), device="cpu")
    assert not translator.languages.multilingual
    plain = translator.translate(EN)
    assert translator.translate(EN, src_lang="en", tgt_lang="de") == plain
    with pytest.raises(ConfigError, match=r"^this model translates en-de only, not en-fr;"):
        translator.translate(EN, tgt_lang="fr")
    assert translator.route().tag_id is None


def test_alignments_leave_the_language_token_out(multi) -> None:
    from litmt.decoding.analysis.alignment import AlignConfig
    from litmt.decoding.languages import Route

    _, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    (text, _, links), *_ = translator.translate(
        EN[:1], tgt_lang="fr", beam_size=1, alignment=AlignConfig()
    )[0]
    n_src, n_tgt = len(EN[0].split()), len(text.split())
    pairs = [tuple(map(int, x.split("-"))) for x in links.split()]
    assert pairs and all(0 <= i < n_src and 0 <= j < n_tgt for i, j in pairs)
    assert Route("en", "fr", 5, "source").untagged_alignment("0-0 1-0 2-1") == "0-0 1-1"
    assert Route("en", "fr", 5, "target").untagged_alignment("0-0 1-1 2-2") == "1-0 2-1"
    assert Route("en", "de").untagged_alignment("0-0") == "0-0"
