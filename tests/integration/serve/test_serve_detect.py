"""Language detection on 127.0.0.1 (`litmt.deploy.server.input.detect`): ``/detect`` answers
LibreTranslate's list of ``{"confidence": 0-100, "language"}``, best first, among the model's
source languages only; ``source=auto`` translates each text from its detected language and
answers ``detectedLanguage`` as LibreTranslate does; without lingua, today's answer (a 400
naming the sources) with one log line. The slow test measures the detector's accuracy on
Multi30k test2016 (en, de, fr, cs)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("lingua", reason="lingua-language-detector (the serve extra) is not installed")

from server_thread import ServerThread  # noqa: E402
from tiny_checkpoint import build_tiny_multilingual_checkpoint  # noqa: E402

from litmt.data.directions import parse_directions  # noqa: E402
from litmt.decoding.languages import Languages  # noqa: E402
from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402
from litmt.deploy.server.input.detect import LanguageDetector  # noqa: E402

GREEDY = {"beam_size": 1}
TEXT = {
    "en": "The weather is lovely today and we are going for a long walk in the park.",
    "de": "Das Wetter ist heute schön und wir gehen im Park lange spazieren.",
    "fr": "Il fait beau aujourd'hui et nous allons faire une longue promenade dans le parc.",
    "cs": "Dnes je krásné počasí a jdeme na dlouhou procházku do parku.",
}
# texts to translate: over 40 characters (detected alone), in sentences short enough for the
# tiny model's source limit (48 tokens)
SHORT_SENTENCES = {
    "en": "The dog sleeps. The cat eats. We walk home today.",
    "de": "Der Hund schläft. Die Katze isst. Wir gehen heute.",
    "fr": "Le chien dort. Le chat mange. Nous marchons ici.",
}
# the tiny en->de/en->fr model, told it also reads de and fr: three source languages
DIRECTIONS = ["en-de", "en-fr", "de-fr", "fr-de"]
OFF = "language detection is off"


def _with_directions(translator: Translator, directions: list[str]) -> Translator:
    languages = translator.languages
    translator.languages = Languages(
        languages.src_lang, languages.tgt_lang, parse_directions(directions), languages.placement
    )
    return translator


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_tiny_multilingual_checkpoint(tmp_path_factory.mktemp("serve_detect"))


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    """The tiny model with sources en, de, fr; `calls` records each decoding's direction."""
    model = _with_directions(Translator.from_checkpoint(checkpoint, device="cpu"), DIRECTIONS)
    plain = model.translate
    model.calls = []

    def recording(units: list[str], **kw: Any) -> Any:
        model.calls.append((kw.get("src_lang"), kw.get("tgt_lang"), list(units)))
        return plain(units, **kw)

    model.plain = plain
    model.translate = recording
    return model


@pytest.fixture(scope="module")
def client(translator):
    app = create_app(translator, ServeConfig(decoding=GREEDY))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _detections(r: httpx.Response) -> list[dict[str, Any]]:
    """A 200 answer in LibreTranslate's /detect shape, best first."""
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and body
    for item in body:
        assert set(item) == {"confidence", "language"}
        assert isinstance(item["confidence"], float) and 0 < item["confidence"] <= 100
        assert isinstance(item["language"], str)
    confidences = [item["confidence"] for item in body]
    assert confidences == sorted(confidences, reverse=True)
    return body


# -- /detect --------------------------------------------------------------------------------
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_detect_answers_the_language_in_libretranslates_shape(client, lang) -> None:
    for r in (
        client.post("/detect", json={"q": TEXT[lang]}),
        client.post("/detect", data={"q": TEXT[lang]}),  # a form, as LibreTranslate's UI
    ):
        body = _detections(r)
        assert body[0]["language"] == lang
        assert body[0]["confidence"] > 50
        assert {item["language"] for item in body} <= {"en", "de", "fr"}


def test_detect_on_a_list_q_is_one_ranking_of_all_texts(client) -> None:
    """LibreTranslate's ``detect_languages`` on a list: one list, each language once, its
    confidence the mean over the texts it was found in."""
    body = _detections(client.post("/detect", json={"q": [TEXT["de"], TEXT["de"], "Guten Tag"]}))
    assert body[0]["language"] == "de"
    assert len({item["language"] for item in body}) == len(body)
    r = client.post("/detect", json={})
    assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing q parameter"}


def test_detect_answers_only_the_models_source_languages(client) -> None:
    """Czech is not a source language of the model: the answer is among en, de, fr."""
    body = _detections(client.post("/detect", json={"q": TEXT["cs"]}))
    assert {item["language"] for item in body} <= {"en", "de", "fr"}
    nothing = client.post("/detect", json={"q": "12345 !!"})  # no language: LibreTranslate's
    assert nothing.status_code == 200 and nothing.json() == [{"confidence": 0.0, "language": "en"}]


def test_the_detector_is_restricted_to_the_languages_it_is_given(caplog) -> None:
    detector = LanguageDetector(["en", "de"])
    assert detector.available()
    found = detector.detect_languages([TEXT["fr"]], batch=False)
    assert {item["language"] for item in found} <= {"en", "de"}
    assert detector.detect_languages([TEXT["de"]], False)[0]["language"] == "de"
    assert not LanguageDetector(["en"]).available()  # one language: nothing to detect
    with caplog.at_level(logging.WARNING, logger="litmt.deploy.server.input.detect"):
        unknown = LanguageDetector(["en", "xx"])
        assert not unknown.available() and not unknown.available()
    lines = [rec.getMessage() for rec in caplog.records if OFF in rec.getMessage()]
    assert len(lines) == 1 and "'xx'" in lines[0], lines


# -- source=auto ----------------------------------------------------------------------------
def test_auto_routes_each_text_to_its_detected_source(client, translator) -> None:
    translator.calls.clear()
    r = client.post("/translate", json={"q": [SHORT_SENTENCES["en"], SHORT_SENTENCES["fr"]], "source": "auto", "target": "de"})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "fr"]
    for d in body["detectedLanguage"]:
        assert set(d) == {"confidence", "language"} and 50 < d["confidence"] <= 100
    directions = {(src, tgt) for src, tgt, _ in translator.calls}
    assert directions == {("en", "de"), ("fr", "de")}
    want = [
        translator.plain([SHORT_SENTENCES["en"]], src_lang="en", tgt_lang="de", **GREEDY)[0],
        translator.plain([SHORT_SENTENCES["fr"]], src_lang="fr", tgt_lang="de", **GREEDY)[0],
    ]
    assert body["translatedText"] == want
    # a string q: one detectedLanguage object
    translator.calls.clear()
    r = client.post(
        "/translate", json={"q": SHORT_SENTENCES["de"], "source": "auto", "target": "fr"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["detectedLanguage"]["language"] == "de"
    assert {(src, tgt) for src, tgt, _ in translator.calls} == {("de", "fr")}
    # German to German is no direction of the model: a 400, not a translation from en
    r = client.post(
        "/translate", json={"q": SHORT_SENTENCES["de"], "source": "auto", "target": "de"}
    )
    assert r.status_code == 400, r.text
    r = client.post(
        "/translate", json={"q": SHORT_SENTENCES["de"], "source": "auto", "target": "zz"}
    )
    assert r.status_code == 400 and r.json() == {"error": "zz is not supported"}


def test_auto_on_short_texts_takes_the_whole_requests_language(client) -> None:
    """LibreTranslate: a text of at most 40 characters is too short to tell alone."""
    r = client.post("/translate", json={"q": ["Hallo.", SHORT_SENTENCES["de"]], "source": "auto", "target": "fr"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [d["language"] for d in r.json()["detectedLanguage"]] == ["de", "de"]


def test_frontend_settings_offers_auto(client) -> None:
    source = client.get("/frontend/settings").json()["language"]["source"]
    assert source == {"code": "auto", "name": "Auto Detect"}


# -- without lingua -------------------------------------------------------------------------
def test_without_lingua_the_answer_is_todays_with_one_log_line(
    checkpoint, monkeypatch, caplog
) -> None:
    monkeypatch.setitem(sys.modules, "lingua", None)  # `import lingua` raises ImportError
    model = _with_directions(Translator.from_checkpoint(checkpoint, device="cpu"), DIRECTIONS)
    refusal = {
        "error": "source=auto is not supported: this model translates from en, de, fr and "
        "does not detect languages; give source as one of them"
    }
    app = create_app(model, ServeConfig(decoding=GREEDY))
    with (
        caplog.at_level(logging.WARNING, logger="litmt.deploy.server.input.detect"),
        ServerThread(app) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        for _ in range(2):
            r = c.post("/detect", json={"q": SHORT_SENTENCES["de"]})
            assert r.status_code == 400 and r.json() == refusal
            r = c.post(
                "/translate", json={"q": SHORT_SENTENCES["de"], "source": "auto", "target": "fr"}
            )
            assert r.status_code == 400 and r.json() == refusal
        source = c.get("/frontend/settings").json()["language"]["source"]
        assert source == {"code": "en", "name": "English"}
        r = c.post("/translate", json={"q": SHORT_SENTENCES["de"], "source": "de", "target": "fr"})
        assert r.status_code == 200 and "detectedLanguage" not in r.json()
    lines = [rec.getMessage() for rec in caplog.records if OFF in rec.getMessage()]
    assert len(lines) == 1 and "not installed" in lines[0], lines


# -- accuracy on real data ------------------------------------------------------------------
@pytest.mark.slow
def test_detect_accuracy_on_multi30k_test2016(multi30k_dir, checkpoint, capsys) -> None:
    """/detect on the first 50 lines of test2016 in en, de, fr, cs, on a server whose model
    reads those four: the accuracy per language (printed; each at least 90 %)."""
    langs = ["en", "de", "fr", "cs"]
    files = {lang: multi30k_dir / f"test2016.{lang}" for lang in langs}
    if not all(p.exists() for p in files.values()):
        pytest.skip("test2016.{en,de,fr,cs} not found in ../shared/data/multi30k")
    model = _with_directions(
        Translator.from_checkpoint(checkpoint, device="cpu"), ["en-de", "de-fr", "fr-de", "cs-de"]
    )
    app = create_app(model, ServeConfig(decoding=GREEDY))
    accuracy = {}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        for lang, path in files.items():
            lines = path.read_text(encoding="utf-8").splitlines()[:50]
            right = sum(
                _detections(c.post("/detect", json={"q": line}))[0]["language"] == lang
                for line in lines
            )
            accuracy[lang] = (right, len(lines))
    with capsys.disabled():
        print("\n/detect accuracy, test2016 first 50 lines, detector on en, de, fr, cs:")
        for lang, (right, n) in accuracy.items():
            print(f"  {lang}: {right}/{n} = {right / n:.0%}")
    assert all(right >= 0.9 * n for right, n in accuracy.values()), accuracy
