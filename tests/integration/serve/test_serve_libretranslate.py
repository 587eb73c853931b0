"""LibreTranslate parity of the HTTP server on 127.0.0.1 (`litmt.deploy.server.routes.libretranslate`):
source=auto, /detect, alternatives, format=html, language codes, /frontend/settings,
/suggest, /translate_file, and the cases of LibreTranslate's own API tests
(``libretranslate/tests/test_api/``, commit 39429cb) that apply to a one-pair server."""

from __future__ import annotations

import html

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")


from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import ServeConfig, build_server_app  # noqa: E402
from litmt.deploy.server.routes.libretranslate import HtmlText, filter_unique, iso2model, model2iso  # noqa: E402

DECODING = {"beam_size": 3, "max_len_a": 1.2, "max_len_b": 10}
SENTENCES = ["A red dog runs.", "A big man sleeps here.", "A small cat eats today."]
SURE = {"confidence": 100.0, "language": "en"}


@pytest.fixture(scope="module")
def client(ckpt):
    settings = ServeConfig(max_texts=8, max_chars=300, max_text_chars=200, decoding=DECODING)
    app = build_server_app(ckpt, device="cpu", settings=settings, explorer=False)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"error": message}


# -- source=auto and /detect ------------------------------------------------------------
def test_auto_source_answers_detected_language(client, reference):
    expected = reference.translate(SENTENCES, **DECODING)
    body = _ok(
        client.post("/translate", json={"q": SENTENCES[0], "source": "auto", "target": "de"})
    )
    assert body == {"translatedText": expected[0], "detectedLanguage": SURE}
    body = _ok(client.post("/translate", json={"q": SENTENCES, "source": "auto", "target": "de"}))
    assert body == {"translatedText": expected, "detectedLanguage": [SURE] * 3}
    # a named source has no detectedLanguage, as in LibreTranslate
    body = _ok(client.post("/translate", json={"q": SENTENCES[0], "source": "en", "target": "de"}))
    assert body == {"translatedText": expected[0]}


def test_detect_answers_libretranslate_list_shape(client):
    assert _ok(client.post("/detect", json={"q": "Hallo"})) == [SURE]
    assert _ok(client.post("/detect", data={"q": ["A dog.", "A cat."]})) == [SURE]
    _error(client.post("/detect", json={}), 400, "Invalid request: missing q parameter")


# -- alternatives -----------------------------------------------------------------------
def test_alternatives_are_the_beam_nbest_capped_by_beam_size(client, reference):
    nbest = reference.translate(SENTENCES, n_best=3, return_scores=True, **DECODING)
    texts = [[t for t, _ in hyps] for hyps in nbest]
    best = [hyps[0] for hyps in texts]
    others = [[t for t in dict.fromkeys(hyps[1:]) if t not in (hyps[0], "")] for hyps in texts]
    assert any(others), "the tiny model's beam gave no alternative: the test proves nothing"
    q = {"q": SENTENCES[0], "source": "en", "target": "de"}
    body = _ok(client.post("/translate", json={**q, "alternatives": 1}))
    assert body == {"translatedText": best[0], "alternatives": others[0][:1]}
    body = _ok(client.post("/translate", json={**q, "alternatives": 10}))  # beam_size=3 caps it
    assert body == {"translatedText": best[0], "alternatives": others[0]}
    body = _ok(client.post("/translate", json={**q, "q": SENTENCES, "alternatives": "5"}))
    assert body == {"translatedText": best, "alternatives": others}
    assert _ok(client.post("/translate", json={**q, "alternatives": 0})) == {
        "translatedText": best[0]
    }
    _error(
        client.post("/translate", json={**q, "alternatives": "many"}),
        400,
        "Invalid request: alternatives parameter is not a number",
    )


def test_alternatives_drop_the_best_duplicates_and_empty_strings_like_libretranslate():
    # a beam's distinct token sequences can detokenise to the same text
    assert filter_unique(["b", "a", "", "c", "b", "a"], "a") == ["b", "c"]


# -- format=html ------------------------------------------------------------------------
def test_html_translates_text_nodes_and_keeps_the_markup(client, reference):
    a, b = reference.translate(SENTENCES[:2], **DECODING)
    source = (
        f'<p class="x">{SENTENCES[0]}</p>\n<!-- note --><br/>'
        f"<b> {SENTENCES[1]} </b><script>var a = 1 < 2;</script>"
    )
    want = (
        f'<p class="x">{html.escape(a, quote=False)}</p>\n<!-- note --><br/>'
        f"<b> {html.escape(b, quote=False)} </b><script>var a = 1 < 2;</script>"
    )
    body = _ok(
        client.post(
            "/translate", json={"q": source, "source": "en", "target": "de", "format": "html"}
        )
    )
    assert body == {"translatedText": want}


@pytest.mark.parametrize(
    "markup",
    [
        '<div id="a"><p>One &amp; two</p><img src="x.png" alt="y"><p>three</p></div>',
        "<!DOCTYPE html><html><body>Text<br>more &lt;b&gt;</body></html>",
        "<ul><li>open<li>unclosed</ul><style>p { color: red }</style>",
        "plain text, no tags",
    ],
)
def test_html_round_trips_when_each_node_translates_to_itself(markup):
    doc = HtmlText(markup)
    assert doc.render(doc.texts) == markup


# -- language codes ---------------------------------------------------------------------
def test_language_codes_are_lowercased_and_aliases_accepted(client, reference):
    expected = reference.translate(SENTENCES[:1], **DECODING)[0]
    body = _ok(client.post("/translate", json={"q": SENTENCES[0], "source": "EN", "target": "De"}))
    assert body == {"translatedText": expected}
    # LibreTranslate does not strip regions: en-US is refused, lowercased in the message
    _error(
        client.post("/translate", json={"q": "A dog.", "source": "en-US", "target": "de"}),
        400,
        "en-us is not supported",
    )
    assert [iso2model(c) for c in ("pt-BR", "ZH-Hans", "zh-hant", "FR")] == ["pb", "zh", "zt", "fr"]
    assert [model2iso(c) for c in ("pb", "zh", "zt", "fr")] == ["pt-BR", "zh-Hans", "zh-Hant", "fr"]


# -- /frontend/settings, /suggest, /translate_file --------------------------------------
def test_frontend_settings_has_what_the_web_ui_reads(client):
    assert _ok(client.get("/frontend/settings")) == {
        "charLimit": 200,  # per text, as LibreTranslate's char_limit (max_text_chars here)
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt"],
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "de", "name": "German"},
        },
    }


def test_suggest_is_disabled_with_403(client):
    r = client.post(
        "/suggest", json={"q": "A dog.", "s": "Ein Hund.", "source": "en", "target": "de"}
    )
    _error(r, 403, "Suggestions are disabled on this server.")


def test_translate_file_txt_round_trip(client, reference):
    expected = reference.translate(SENTENCES[:2], **DECODING)
    content = f"{SENTENCES[0]}\r\n{SENTENCES[1]}\n".encode()
    fields = {"source": "auto", "target": "de"}
    r = client.post("/translate_file", data=fields, files={"file": ("notes.txt", content)})
    url = _ok(r)["translatedFileUrl"]
    assert url.startswith(str(client.base_url)) and url.endswith(".notes.txt")
    got = client.get(url)
    assert got.status_code == 200
    assert got.text == "\n".join(expected) + "\n"
    assert 'filename="notes.txt"' in got.headers["content-disposition"]


def test_translate_file_errors(client):
    fields = {"source": "en", "target": "de"}
    post = client.post
    _error(post("/translate_file", data=fields, files={"file": ("a.pdf", b"x")}), 400,
           "Invalid request: file format not supported")  # fmt: skip
    _error(post("/translate_file", data=fields, files={"other": ("a.txt", b"x")}), 400,
           "Invalid request: missing file parameter")  # fmt: skip
    _error(post("/translate_file", data={"source": "en"}, files={"file": ("a.txt", b"x")}), 400,
           "Invalid request: missing target parameter")  # fmt: skip
    _error(post("/translate_file", data={**fields, "target": "zz"}, files={"file": ("a.txt", b"x")}),
           400, "zz is not supported")  # fmt: skip
    _error(client.get("/download_file/%2E%2E"), 400, "Invalid filename")
    assert client.get("/download_file/nothing.txt").status_code == 404


# -- LibreTranslate's own API tests, ported (en→es there, en→de here) -------------------
# LibreTranslate's tests check shapes (its models vary); here each answer is also the one
# the reference translator gives for the same text and decoding settings


def test_lt_api_translate(client, reference):
    r = client.post(
        "/translate", data={"q": "Hello", "source": "en", "target": "de", "format": "text"}
    )
    assert _ok(r) == {"translatedText": reference.translate(["Hello"], **DECODING)[0]}


def test_lt_api_translate_batch(client, reference):
    expected = reference.translate(["Hello", "World"], **DECODING)
    assert expected[0] != expected[1], "the two texts translate alike: order is not checked"
    r = client.post(
        "/translate",
        json={"q": ["Hello", "World"], "source": "en", "target": "de", "format": "text"},
    )
    assert _ok(r) == {"translatedText": expected}  # a list, one translation a text, in order


def test_lt_api_translate_unsupported_language(client):
    r = client.post(
        "/translate", data={"q": "Hello", "source": "en", "target": "zz", "format": "text"}
    )
    _error(r, 400, "zz is not supported")


def test_lt_api_translate_missing_parameter(client):
    r = client.post("/translate", data={"source": "en", "target": "de", "format": "text"})
    _error(r, 400, "Invalid request: missing q parameter")


def test_lt_api_detect_language(client):
    # the model's one source language, with LibreTranslate's confidence for a sure answer
    assert _ok(client.post("/detect", data={"q": "Hello"})) == [SURE]


def test_lt_api_detect_language_must_fail_without_parameters(client):
    _error(client.post("/detect"), 400, "Invalid request: missing q parameter")


@pytest.mark.parametrize(
    "method, route",
    [("get", "/detect"), ("post", "/languages"), ("post", "/health"), ("get", "/suggest")],
)
def test_lt_api_must_fail_bad_request_type(client, method, route):
    _error(getattr(client, method)(route), 405, "Method Not Allowed")


def test_lt_api_get_frontend_settings_and_languages(client):
    settings = _ok(client.get("/frontend/settings"))
    assert settings["language"]["target"] == {"code": "de", "name": "German"}
    assert _ok(client.get("/languages")) == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_lt_api_get_health(client):
    # LibreTranslate answers exactly {"status": "ok"}; litmt adds what it serves and its
    # batching counters
    body = _ok(client.get("/health"))
    served = {k: body[k] for k in ("status", "engine", "source", "target", "directions")}
    assert served == {
        "status": "ok",
        "engine": "torch",
        "source": "en",
        "target": "de",
        "directions": ["en-de"],
    }
    assert body["queued"] == 0 and body["failed"] == 0 and body["timed_out"] == 0


# -- parity gaps of issue 43 ------------------------------------------------------------
def test_char_limit_is_the_per_text_limit_as_in_libretranslate(client):
    # LibreTranslate checks char_limit against each text of q (app.py, commit e9e58e6);
    # the UI's charLimit is litmt's per-text bound: min(max_text_chars, max_chars)
    assert _ok(client.get("/frontend/settings"))["charLimit"] == 200
    r = client.post("/translate", json={"q": ["a" * 201], "source": "en", "target": "de"})
    assert r.status_code == 413 and "max_text_chars=200" in r.json()["error"]


def test_repeated_form_field_takes_the_first_value_as_libretranslate(client, reference):
    # LibreTranslate reads forms with werkzeug's request.values.get: the first value
    r = client.post(
        "/translate",
        content="q=A+red+dog+runs.&q=A+small+cat+eats+today.&source=en&target=de&target=fr",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert _ok(r) == {"translatedText": reference.translate(["A red dog runs."], **DECODING)[0]}


@pytest.fixture(scope="module")
def multi_client(tmp_path_factory):
    """A multilingual server whose first direction's source (fr) is not the checkpoint's
    ``src_lang`` (en): the tiny en→de/en→fr model, its directions listed fr-de first."""
    from fastapi.testclient import TestClient
    from tiny_checkpoint import build_tiny_multilingual_checkpoint

    from litmt.data.directions import parse_directions
    from litmt.decoding.languages import Languages
    from litmt.decoding.translator import Translator
    from litmt.deploy.server.app import create_app

    path = build_tiny_multilingual_checkpoint(tmp_path_factory.mktemp("lt_multi"))
    translator = Translator.from_checkpoint(path, device="cpu")
    languages = translator.languages
    translator.languages = Languages(
        languages.src_lang,
        languages.tgt_lang,
        parse_directions(["fr-de", "en-de", "en-fr"]),
        languages.placement,
    )
    with TestClient(create_app(translator, ServeConfig(decoding={"beam_size": 1}))) as c:
        yield c


def test_auto_source_on_several_source_languages_detects_among_them(multi_client):
    """The detector (lingua; tests/integration/serve/test_serve_detect.py) chooses among the
    model's sources (fr, en) only: "A dog." is en, not fr (the first source that reaches
    de), and is translated from en."""
    for target in ("de", "fr"):
        r = multi_client.post("/translate", json={"q": "A dog.", "source": "auto", "target": target})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["detectedLanguage"]["language"] == "en"
    found = multi_client.post("/detect", json={"q": "A dog."}).json()
    assert found[0]["language"] == "en" and {d["language"] for d in found} <= {"fr", "en"}


@pytest.mark.parametrize(
    "source, target, unsupported", [("en", "zz", "zz"), ("zz", "de", "zz"), ("xx", "yy", "xx")]
)
def test_unknown_language_on_a_multilingual_model_is_libretranslates_400(
    multi_client, source, target, unsupported
):
    r = multi_client.post("/translate", data={"q": "Hello", "source": source, "target": target})
    _error(r, 400, f"{unsupported} is not supported")
