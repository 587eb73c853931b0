"""format=hf on a multilingual model (en→de, en→fr, both tag placements): plain transformers,
called as the model card says, translates every direction as litmt does (greedy, the same
text); the language tokens are added special tokens with litmt's ids; export -> import keeps
the directions; what the export cannot carry is refused with one line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("transformers")

from tiny_checkpoint import build_tiny_multilingual_checkpoint, corpus

from benchmarks.hf_models import make_marian_dir
from checks.hf_parity import hf_translate
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.load import load_model
from litmt.cli.import_hf import import_hf
from litmt.decoding.translator import Translator
from litmt.deploy.export.base import ExportError
from litmt.deploy.export.hf import check_hf_exportable, export_hf

DIRECTIONS = {"en-de": "<2de>", "en-fr": "<2fr>"}


@pytest.fixture(scope="module", params=["source", "target"])
def exported(request, tmp_path_factory) -> tuple[str, Path, Path]:
    d = tmp_path_factory.mktemp(f"hf_multi_{request.param}")
    ckpt = build_tiny_multilingual_checkpoint(d, request.param)
    return request.param, ckpt, export_hf(ckpt, d / "hf")


def card_call(placement: str, tag: str) -> str:
    """The line of the model card that picks the direction of `tag` (what the test runs)."""
    if placement == "target":
        return f'model.generate(**enc, forced_bos_token_id=tok.convert_tokens_to_ids("{tag}"))'
    return f'model.generate(**tok(["{tag} ..."], return_tensors="pt"))'


def test_every_direction_matches_litmt_with_the_cards_call(exported) -> None:
    from transformers import AutoTokenizer

    placement, ckpt, out = exported
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    tok = AutoTokenizer.from_pretrained(out)
    card = (out / "README.md").read_text()
    assert "language: [en, de, fr]" in card
    texts = corpus()[0][:40]
    plain = translator.tokenizer.encode_src(texts)
    for name, tag in DIRECTIONS.items():
        tag_id = translator.tokenizer.tgt_tags[tag]
        assert tok.convert_tokens_to_ids(tag) == tag_id  # litmt's id, one token
        assert f"# {name}\n" in card and card_call(placement, tag) in card
        if placement == "source":  # exactly litmt's [tag, *ids]: no extra "▁" around the tag
            assert tok([f"{tag} {t}" for t in texts])["input_ids"] == [[tag_id, *x] for x in plain]
        tagged = 1 if placement == "source" else 0
        budgets = [math.floor(1.2 * (len(x) + tagged) + 10) + 1 for x in plain]
        want = translator.translate(texts, tgt_lang=name[3:], method="greedy")
        got = hf_translate(out, texts, budgets, direction=(tag, placement))
        assert got == want, name
        assert not any("<2" in g for g in got)
    de = translator.translate(texts, tgt_lang="de", method="greedy")
    assert de != translator.translate(texts, tgt_lang="fr", method="greedy")  # two directions


def test_export_then_import_keeps_the_directions(exported, tmp_path) -> None:
    placement, ckpt, out = exported
    again = import_hf(OmegaConf.create({"model_dir": str(out), "out": str(tmp_path / "x.ckpt")}))
    first, second = load_model(ckpt), load_model(again)
    assert second.meta["directions"] == first.meta["directions"] == ["en-de", "en-fr"]
    assert second.meta["tag_placement"] == first.meta["tag_placement"] == placement
    assert second.model.config == first.model.config
    assert second.tokenizer.to_dict() == first.tokenizer.to_dict()
    for name, tensor in first.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[name], tensor, rtol=0, atol=0)
    a, b = Translator.from_checkpoint(ckpt), Translator.from_checkpoint(again)
    texts = corpus()[0][:10]
    for lang in ("de", "fr"):
        assert a.translate(texts, tgt_lang=lang) == b.translate(texts, tgt_lang=lang)


def test_what_the_export_cannot_carry_is_refused(exported, tmp_path) -> None:
    _, ckpt, _ = exported
    loaded = load_model(ckpt)
    cs = {"directions": ["en-de", "en-cs"], "tag_placement": "target"}
    with pytest.raises(ExportError) as err:
        check_hf_exportable(loaded.model.config, loaded.tokenizer, cs)
    assert str(err.value) == (
        "cannot export format=hf: direction en-cs has no <2cs> piece in the tokenizer"
    )
    marian = read_hf_dir(make_marian_dir(tmp_path / "marian", layers=1))  # a piece vocabulary
    check_hf_exportable(marian.config, marian.tokenizer, {})  # one pair: exportable
    with pytest.raises(ExportError) as err:
        check_hf_exportable(marian.config, marian.tokenizer, cs)
    assert str(err.value) == (
        "cannot export format=hf: a multilingual model with a Marian piece vocabulary "
        "(MarianTokenizer cannot carry the <2xx> language tokens); use format=ct2"
    )
