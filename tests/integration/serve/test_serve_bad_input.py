"""Bad input never reaches the model and never gets a 500: each of ten malformed requests
(numbers JSON allows but Python cannot use, lone surrogates, wrong types, huge attention
indices, an over-long file name) is a JSON 4xx with one line, answered before any decoding,
through the app in-process and through uvicorn on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from server_thread import ServerThread  # noqa: E402

from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402
from litmt.deploy.server.routes import explorer as routes_explorer  # noqa: E402

DECODING = {"beam_size": 2, "max_len_a": 1.2, "max_len_b": 10}
JSON = {"content-type": "application/json"}
HEAD = b'{"q": "A red dog runs.", "source": "en", "target": "de"'


class Spy:
    """A `Translator` that counts its decodings: ``translate`` calls and attention maps."""

    def __init__(self, inner: Translator) -> None:
        self.inner, self.calls = inner, 0

    def translate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner.translate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _json(tail: bytes) -> dict[str, Any]:
    """A /translate JSON body: the valid request with `tail` (raw JSON fields) added."""
    return dict(content=HEAD + tail + b"}", headers=JSON)


# name -> (route, httpx keywords, status, a part of the error message)
BAD: dict[str, tuple[str, dict[str, Any], int, str]] = {
    "alternatives 1e999": (
        "/translate",
        _json(b', "alternatives": 1e999'),
        400,
        "alternatives parameter is not a number",
    ),
    "a 5000-digit integer": (
        "/translate",
        _json(b', "alternatives": ' + b"9" * 5000),
        400,
        "Invalid JSON format: a number has too many digits",
    ),
    "lone surrogate in q": (
        "/translate",
        dict(content=b'{"q": "A dog \\ud800.", "source": "en", "target": "de"}', headers=JSON),
        400,
        "q is not valid Unicode",
    ),
    "lone surrogate in source": (
        "/translate",
        dict(content=b'{"q": "A dog.", "source": "e\\udfffn", "target": "de"}', headers=JSON),
        400,
        "source is not valid Unicode",
    ),
    "attention layer 1e999": (
        "/attention",
        dict(content=b'{"q": "A red dog runs.", "layer": 1e999}', headers=JSON),
        400,
        "layer must be an integer",
    ),
    "a 300-character file name": (
        "/translate_file",
        dict(
            data={"source": "en", "target": "de"},
            files={"file": ("x" * 296 + ".txt", b"A red dog runs.\n", "text/plain")},
        ),
        400,
        "the file name is too long",
    ),
    "attention head 10**30": (
        "/attention",
        dict(json={"q": "A red dog runs.", "layer": 0, "head": 10**30}),
        400,
        f"head {10**30} does not exist (the model has 4)",
    ),
    "attention layer NaN": (
        "/attention",
        dict(content=b'{"q": "A red dog runs.", "layer": NaN}', headers=JSON),
        400,
        "layer must be an integer",
    ),
    "attention layer true": (  # a bool is not a layer number, though int(True) == 1
        "/attention",
        dict(json={"q": "A red dog runs.", "layer": True}),
        400,
        "layer must be an integer",
    ),
    "non-UTF-8 body": (
        "/translate",
        dict(content=b'{"q": "A dog \xff.", "source": "en", "target": "de"}', headers=JSON),
        400,
        "Invalid JSON format",
    ),
}
# the five a probe of the running server found answered with a 500
PROBED = list(BAD)[:6]
PROBED.remove("a 5000-digit integer")  # (the sixth: one 500 covers two of the probe's)


@pytest.fixture(scope="module")
def spy(reference) -> Spy:
    return Spy(reference)


@pytest.fixture(scope="module")
def app(spy):
    settings = ServeConfig(max_wait_ms=0, max_body_bytes=20_000, decoding=DECODING)
    with pytest.MonkeyPatch.context() as patch:
        real = routes_explorer.attention_maps

        def counted(*args: Any, **kwargs: Any) -> Any:  # /attention's decoding
            spy.calls += 1
            return real(*args, **kwargs)

        patch.setattr(routes_explorer, "attention_maps", counted)
        yield create_app(spy, settings, attention_model=spy)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _check(response: Any, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and message in body["error"], body
    assert "\n" not in body["error"]


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_json_4xx_before_any_decoding(client, spy, name):
    route, request, status, message = BAD[name]
    before = spy.calls
    _check(client.post(route, **request), status, message)
    assert spy.calls == before, "the model ran for a request refused as bad input"


def test_the_same_requests_well_formed_are_translated(client, spy, reference):
    """The checks refuse only the bad part: each route still decodes a good request."""
    nbest = reference.translate(["A red dog runs."], n_best=2, return_scores=True, **DECODING)
    best, second = [text for text, _ in nbest[0]]
    assert second not in (best, ""), "the beam's second is no alternative: the test proves nothing"
    before = spy.calls
    r = client.post("/translate", **_json(b', "alternatives": 1'))
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": best, "alternatives": [second]}  # the one asked for
    r = client.post("/attention", json={"q": "A red dog runs.", "layer": "1", "head": -1})
    assert r.status_code == 200 and (r.json()["layer"], r.json()["head"]) == (1, 3)
    r = client.post(
        "/translate_file",
        data={"source": "en", "target": "de"},
        files={"file": ("x" * 150 + ".txt", b"A red dog runs.\n", "text/plain")},
    )
    assert r.status_code == 200 and "translatedFileUrl" in r.json()
    r = client.post("/translate", json={"q": "A dog \U0001f600.", "source": "en", "target": "de"})
    assert r.status_code == 200  # a surrogate pair is a valid character
    assert spy.calls == before + 4


def test_the_probed_inputs_through_uvicorn_on_loopback(app, spy):
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        before = spy.calls
        for name in PROBED:
            route, request, status, message = BAD[name]
            _check(c.post(route, **request), status, message)
        assert spy.calls == before
        health = c.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
