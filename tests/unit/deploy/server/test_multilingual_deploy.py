"""A multilingual model (en→de, en→fr) behind the server and the ct2 engine: ``target=fr``
routes to the `<2fr>` token, ``/languages`` lists every target, unknown directions are a 400
with one line, and engine=ct2 gives the torch engine's output for both tag placements."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_multilingual_checkpoint

from litmt.decoding.translator import Translator

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("httpx", reason="the serve extra is not installed")

from fastapi.testclient import TestClient

from litmt.deploy.server.app import ServeConfig, create_app

EN = ["A red dog runs.", "A small cat sleeps here.", "A young bird sings outside."]


@pytest.fixture(scope="module", params=["source", "target"])
def multi(request, tmp_path_factory) -> tuple[str, Path]:
    placement = request.param
    directory = tmp_path_factory.mktemp(f"multi_deploy_{placement}")
    return placement, build_tiny_multilingual_checkpoint(directory, placement)


def test_the_server_routes_target_to_the_tag(multi) -> None:
    _, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    settings = ServeConfig(decoding={"beam_size": 1})
    with TestClient(create_app(translator, settings)) as client:
        langs = client.get("/languages").json()
        assert langs == [
            {"code": "en", "name": "English", "targets": ["de", "fr"]},
            {"code": "de", "name": "German", "targets": []},
            {"code": "fr", "name": "French", "targets": []},
        ]
        for target in ("de", "fr"):
            r = client.post("/translate", json={"q": EN, "source": "en", "target": target})
            assert r.status_code == 200, r.text
            want = translator.translate(EN, tgt_lang=target, beam_size=1)
            assert r.json()["translatedText"] == want
        r = client.post("/translate", json={"q": EN[0], "source": "auto", "target": "fr"})
        assert (
            r.json()["translatedText"]
            == translator.translate(EN[:1], tgt_lang="fr", beam_size=1)[0]
        )
        r = client.post("/translate", json={"q": EN[0], "source": "en", "target": "cs"})
        assert r.status_code == 400
        assert r.json() == {"error": "cs is not supported"}  # LibreTranslate's message
        r = client.post("/translate", json={"q": EN[0], "source": "de", "target": "fr"})
        assert r.status_code == 400 and "allow_zero_shot" in r.json()["error"]


def test_the_server_serves_zero_shot_only_when_asked(multi) -> None:
    placement, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    settings = ServeConfig(decoding={"beam_size": 1}, allow_zero_shot=True)
    with TestClient(create_app(translator, settings)) as client:
        de = next(x for x in client.get("/languages").json() if x["code"] == "de")
        assert de["targets"] == ["fr"]
        r = client.post("/translate", json={"q": EN[0], "source": "de", "target": "fr"})
        assert r.status_code == 200, r.text
        # routed to fr: the `<2fr>` token is the route's only mark, so the answer is the
        # model's French for the text (what en→fr gives), not its German
        french = translator.translate(EN[:1], tgt_lang="fr", beam_size=1)[0]
        assert french != translator.translate(EN[:1], tgt_lang="de", beam_size=1)[0]
        assert r.json() == {"translatedText": french}
        zero_shot = translator.translate(
            EN[:1], src_lang="de", tgt_lang="fr", allow_zero_shot=True, beam_size=1
        )
        assert zero_shot == [french]
    # the token the decoding got is <2fr>, on the source side or as the first target token
    with TestClient(create_app(translator, settings, attention_model=translator)) as client:
        r = client.post("/attention", json={"q": EN[0], "source": "de", "target": "fr"})
        assert r.status_code == 200, r.text
        body = r.json()
        tagged = body["source_pieces"] if placement == "source" else body["target_pieces"]
        assert tagged[0] == "<2fr>" and body["translation"] == french


def test_ct2_matches_torch_on_a_multilingual_model(multi, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from litmt.deploy.engines.ct2 import CT2Translator
    from litmt.deploy.export.ct2 import export_model

    placement, path = multi
    torch_engine = Translator.from_checkpoint(path, device="cpu")
    ct2_engine = CT2Translator(export_model(path, tmp_path / "export"), device="cpu")
    assert ct2_engine.languages.placement == placement
    assert ct2_engine.languages.targets_of("en") == ["de", "fr"]
    for lang in ("de", "fr"):
        for beam in (1, 3):
            want = torch_engine.translate(EN, tgt_lang=lang, beam_size=beam)
            got = ct2_engine.translate(EN, tgt_lang=lang, beam_size=beam)
            assert got == want, (lang, beam)
            assert not any("<2" in t for t in got)
    assert ct2_engine.translate(EN, tgt_lang="de") != ct2_engine.translate(EN, tgt_lang="fr")


def test_an_argos_package_is_one_direction_with_its_target_prefix() -> None:
    from litmt.deploy.export.argos import argos_metadata
    from litmt.errors import ConfigError

    settings = {"package_version": "1.0", "argos_version": "1.9", "tgt_lang": "fr"}
    meta = {"src_lang": "en", "tgt_lang": "de", "directions": ["en-de", "en-fr"]}
    got = argos_metadata({**meta, "tag_placement": "target"}, settings)
    assert (got["from_code"], got["to_code"], got["target_prefix"]) == ("en", "fr", "<2fr>")
    with pytest.raises(
        ConfigError, match=r"^cannot export an Argos package of a model with source"
    ):
        argos_metadata({**meta, "tag_placement": "source"}, settings)
    with pytest.raises(ConfigError, match=r"^this model translates en-de, en-fr; an Argos package"):
        argos_metadata({**meta, "tag_placement": "target"}, {**settings, "tgt_lang": None})
    one_pair = argos_metadata({"src_lang": "en", "tgt_lang": "de"}, settings)
    assert "target_prefix" not in one_pair and one_pair["to_code"] == "de"


def test_the_attention_page_decodes_the_chosen_direction(multi) -> None:
    """The page decodes a direction the way /translate does: with its token on the source
    side, or forced as the first target token (a target position of the map). Without
    ``source``/``target`` it is the first direction (en-de); a direction the model lacks is
    /translate's one-line 400."""
    placement, path = multi
    translator = Translator.from_checkpoint(path, device="cpu")
    settings = ServeConfig(decoding={"beam_size": 1})
    with TestClient(create_app(translator, settings, attention_model=translator)) as client:
        for request, tag, lang in (
            ({}, "<2de>", "de"),
            ({"source": "en", "target": "de"}, "<2de>", "de"),
            ({"source": "en", "target": "fr"}, "<2fr>", "fr"),
            ({"source": "auto", "target": "fr"}, "<2fr>", "fr"),
        ):
            r = client.post("/attention", json={"q": EN[0], **request})
            assert r.status_code == 200, r.text
            body = r.json()
            tagged = body["source_pieces"] if placement == "source" else body["target_pieces"]
            untagged = body["target_pieces"] if placement == "source" else body["source_pieces"]
            assert tagged[0] == tag and not any(p.startswith("<2") for p in untagged)
            want = translator.translate(EN[:1], tgt_lang=lang, beam_size=1)[0]
            assert body["translation"] == want, request
            assert len(body["weights"]) == len(body["target_pieces"])  # (T, S): one row a target
            assert all(len(row) == len(body["source_pieces"]) for row in body["weights"])
        r = client.post("/attention", json={"q": EN[0], "source": "en", "target": "cs"})
        assert r.status_code == 400
        assert r.json() == {"error": "cs is not supported"}  # LibreTranslate's message
        r = client.post("/attention", json={"q": EN[0], "target": "fr"})
        assert r.status_code == 400
        assert r.json() == {"error": "Invalid request: give both source and target, or neither"}
    # the two directions decode differently, so the route is not a no-op
    assert translator.translate(EN[:1], tgt_lang="de", beam_size=1) != translator.translate(
        EN[:1], tgt_lang="fr", beam_size=1
    )
