"""The server on a multilingual model, on 127.0.0.1: ``source=auto`` and ``/detect`` report
only a language the model truly reads (its one source language, else a 400 naming its
sources); ``/attention`` works for both tag placements from a checkpoint and an export says
in one line why it cannot; a leading ``>>fra<<`` token (imported multilingual OPUS-MT
models) reaches every line and sentence the server splits a text into."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402
from tiny_checkpoint import build_tiny_multilingual_checkpoint  # noqa: E402

from litmt.checkpoint.io import save_model_checkpoint  # noqa: E402
from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.server.app import ServeConfig, build_server_app, create_app  # noqa: E402

GREEDY = {"beam_size": 1}
EN = ["A red dog runs.", "A small cat sleeps here.", "A young bird sings outside."]
SURE_EN = {"confidence": 100.0, "language": "en"}
GERMAN = "Ein roter Hund rennt."


@pytest.fixture(scope="module", params=["source", "target"])
def multi(request, tmp_path_factory) -> tuple[str, Path]:
    """(placement, the tiny en-de + en-fr checkpoint with that tag placement)."""
    directory = tmp_path_factory.mktemp(f"serve_multi_{request.param}")
    return request.param, build_tiny_multilingual_checkpoint(directory, request.param)


def _error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"error": message}


# -- (a) source=auto and /detect --------------------------------------------------------
def test_auto_with_several_source_languages_is_a_400_naming_them(
    multi, tmp_path, monkeypatch
) -> None:
    """en-de, en-fr, de-fr without a language detector (lingua not installed): the model
    reads en and de and detects neither; before, German text with ``source=auto`` came back
    with ``detectedLanguage: en`` (the first source that reaches the target), and
    ``/detect`` said en for any text (tests/integration/serve/test_serve_detect.py: with
    lingua)."""
    monkeypatch.setitem(sys.modules, "lingua", None)  # `import lingua` fails
    placement, path = multi
    model = Translator.from_checkpoint(path, device="cpu")
    two = save_model_checkpoint(
        tmp_path / "two_sources.ckpt", model.model, model.tokenizer, "en", "de",
        languages={"directions": ["en-de", "en-fr", "de-fr"], "tag_placement": placement},
    )  # fmt: skip
    refusal = (
        "source=auto is not supported: this model translates from en, de and does not detect "
        "languages; give source as one of them"
    )
    app = build_server_app(two, device="cpu", settings=ServeConfig(decoding=GREEDY))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        for target in ("fr", "de"):
            r = c.post("/translate", json={"q": GERMAN, "source": "auto", "target": target})
            _error(r, 400, refusal)
        _error(c.post("/detect", json={"q": GERMAN}), 400, refusal)
        _error(c.post("/attention", json={"q": EN[0], "source": "auto", "target": "fr"}), 400, refusal)  # fmt: skip
        r = c.post("/translate", json={"q": EN[0], "source": "en", "target": "fr"})
        assert r.status_code == 200 and "detectedLanguage" not in r.json()
        # LibreTranslate's web UI starts from /frontend/settings' source: not auto here
        source = c.get("/frontend/settings").json()["language"]["source"]
        assert source == {"code": "en", "name": "English"}


def test_auto_with_one_source_language_detects_it(multi) -> None:
    """en-de, en-fr: English is the only language the model reads, so it is the answer."""
    _, path = multi
    app = build_server_app(path, device="cpu", settings=ServeConfig(decoding=GREEDY))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        for target in ("de", "fr"):
            r = c.post("/translate", json={"q": EN, "source": "auto", "target": target})
            assert r.status_code == 200, r.text
            assert r.json()["detectedLanguage"] == [SURE_EN] * len(EN)
        assert c.post("/detect", json={"q": "Ein Hund."}).json() == [SURE_EN]
        source = c.get("/frontend/settings").json()["language"]["source"]
        assert source == {"code": "auto", "name": "Auto Detect"}


# -- (b) /attention: both placements from a checkpoint, a plain refusal from an export --
def test_attention_from_a_checkpoint_and_an_export(multi, tmp_path) -> None:
    pytest.importorskip("ctranslate2")
    from litmt.deploy.export.ct2 import export_model
    from litmt.deploy.server.routes.explorer import NO_ATTENTION

    placement, path = multi
    reference = Translator.from_checkpoint(path, device="cpu")
    app = build_server_app(path, device="cpu", settings=ServeConfig(decoding=GREEDY))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        for target, tag in (("de", "<2de>"), ("fr", "<2fr>")):
            r = c.post("/attention", json={"q": EN[1], "source": "en", "target": target})
            assert r.status_code == 200, r.text
            body = r.json()
            pieces = body["source_pieces" if placement == "source" else "target_pieces"]
            assert pieces[0] == tag
            assert body["translation"] == reference.translate(EN[1:2], tgt_lang=target, **GREEDY)[0]  # fmt: skip
            assert len(body["weights"]) == len(body["target_pieces"])
    export = export_model(path, tmp_path / "ct2")
    app = build_server_app(export, settings=ServeConfig(decoding=GREEDY), threads=1)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/translate", json={"q": EN[1], "source": "en", "target": "fr"})
        assert r.json()["translatedText"] == reference.translate(EN[1:2], tgt_lang="fr", **GREEDY)[0]  # fmt: skip
        r = c.post("/attention", json={"q": EN[1], "source": "en", "target": "fr"})
        assert r.status_code == 501
        assert r.json() == {"error": NO_ATTENTION}
        assert NO_ATTENTION == (
            "attention maps need the torch model, which this server has not loaded: an export "
            "runs on CTranslate2, which returns one averaged alignment, not the page's "
            "per-layer, per-head maps; serve a .ckpt with explorer=true"
        )


# -- (c) >>xxx<< tokens carried to every line and sentence -------------------------------
class RecordingTranslator:
    """A `Translator` that records the units the server asks it to translate."""

    def __init__(self, inner: Translator) -> None:
        self.inner = inner
        self.units: list[str] = []

    def translate(self, texts: list[str], **options: Any) -> Any:
        self.units.extend(texts)
        return self.inner.translate(texts, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("mode", ["always", "long"])
def test_an_inline_language_token_reaches_every_unit(ckpt, mode) -> None:
    """``>>fra<< S1 S2\\nS3``: with sentences split (``always``) every sentence, and with
    lines only (``long``) every line, is decoded with the token in front; before, only the
    first unit had it and the rest were decoded into the model's default language."""
    recorder = RecordingTranslator(Translator.from_checkpoint(ckpt, device="cpu"))
    settings = ServeConfig(decoding=GREEDY, split_sentences=mode)
    text = f">>fra<< {EN[0]} {EN[1]}\n{EN[2]}"
    app = create_app(recorder, settings)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/translate", json={"q": text, "source": "en", "target": "de"})
    assert r.status_code == 200, r.text
    if mode == "always":
        want = [f">>fra<< {EN[0]}", f">>fra<< {EN[1]}", f">>fra<< {EN[2]}"]
        out = recorder.inner.translate(want, **GREEDY)
        assert r.json()["translatedText"] == f"{out[0]} {out[1]}\n{out[2]}"
    else:
        want = [f">>fra<< {EN[0]} {EN[1]}", f">>fra<< {EN[2]}"]
        out = recorder.inner.translate(want, **GREEDY)
        assert r.json()["translatedText"] == "\n".join(out)
    assert recorder.units == want
