"""The HTTP server on 127.0.0.1 with a real client: LibreTranslate requests in every encoding,
16 concurrent requests (dynamically batched), each bad input, /attention, the ct2 engine,
a failing batch, and scripts/serve.py in a subprocess."""

from __future__ import annotations

import json
import logging
import re
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from parity import assert_parity  # noqa: E402
from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import (  # noqa: E402
    POSITIVE,
    ServeConfig,
    build_server_app,
    create_app,
)
from litmt.errors import ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
DECODING = {"beam_size": 2, "max_len_a": 1.2, "max_len_b": 10}
SENTENCES = [
    "A red dog runs.",
    "A big man sleeps here.",
    "A small cat eats today.",
    "A young bird sings outside.",
]


@pytest.fixture(scope="module")
def server(ckpt):
    settings = ServeConfig(
        max_batch_sentences=64,
        max_wait_ms=200,  # wide window: the concurrent requests below must meet in a batch
        max_texts=8,
        max_chars=300,
        max_text_chars=200,
        max_body_bytes=4000,
        decoding=DECODING,
    )
    app = build_server_app(ckpt, device="cpu", settings=settings)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _translate(client, **request):
    return client.post("/translate", **request)


def test_single_and_list_q_in_json(client, reference):
    expected = reference.translate(SENTENCES, **DECODING)
    r = _translate(client, json={"q": SENTENCES[0], "source": "en", "target": "de"})
    assert r.status_code == 200 and r.json() == {"translatedText": expected[0]}
    r = _translate(client, json={"q": SENTENCES, "source": "en", "target": "de", "format": "text"})
    assert r.status_code == 200 and r.json() == {"translatedText": expected}


def test_form_and_multipart_encodings_like_libretranslate(client, reference):
    expected = reference.translate(SENTENCES[:1], **DECODING)[0]
    fields = {"q": SENTENCES[0], "source": "en", "target": "de"}
    r = _translate(client, data=fields)  # application/x-www-form-urlencoded
    assert r.status_code == 200 and r.json() == {"translatedText": expected}
    r = _translate(client, files={k: (None, v) for k, v in fields.items()})  # multipart
    assert r.status_code == 200 and r.json() == {"translatedText": expected}
    # a multi-line text is translated line by line, line breaks kept (CRLF normalised)
    r = _translate(client, data={**fields, "q": f"{SENTENCES[0]}\r\n{SENTENCES[1]}"})
    both = reference.translate(SENTENCES[:2], **DECODING)
    assert r.json() == {"translatedText": "\n".join(both)}


def test_sixteen_concurrent_requests_are_answered_and_batched(server, reference):
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(16)]
    expected = reference.translate(texts, **DECODING)
    before = httpx.get(server.url + "/health").json()

    def ask(text: str) -> httpx.Response:
        return httpx.post(
            server.url + "/translate",
            json={"q": text, "source": "en", "target": "de"},
            timeout=60,
        )

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(ask, texts))
    assert [r.status_code for r in responses] == [200] * 16
    got = [r.json()["translatedText"] for r in responses]
    # batched with other requests: float32 sums of another batch shape (equal but at near-ties)
    sources = [reference.prepare(t) for t in texts]
    assert_parity(reference, sources, expected, got, **DECODING)
    after = httpx.get(server.url + "/health").json()
    assert after["largest_batch"] > 1, "concurrent requests were never batched together"
    assert after["batches"] - before["batches"] < 16


BAD = {
    "malformed json": (
        dict(content=b'{"q": "A dog', headers={"content-type": "application/json"}),
        400,
        "Invalid JSON format",
    ),
    "json array": (dict(json=["A dog."]), 400, "Invalid JSON format: expected an object"),
    "missing q": (dict(json={"source": "en", "target": "de"}), 400, "missing q parameter"),
    "empty q": (dict(json={"q": "", "source": "en", "target": "de"}), 400, "missing q parameter"),
    "q not text": (
        dict(json={"q": ["A dog.", 3], "source": "en", "target": "de"}),
        400,
        "q must be a string or a list of strings",
    ),
    "missing source": (dict(json={"q": "A dog.", "target": "de"}), 400, "missing source parameter"),
    "unsupported source": (
        dict(json={"q": "A dog.", "source": "fr", "target": "de"}),
        400,
        "fr is not supported",
    ),
    "unsupported target": (
        dict(data={"q": "A dog.", "source": "en", "target": "es"}),
        400,
        "es is not supported",
    ),
    "xml format": (
        dict(json={"q": "A dog.", "source": "en", "target": "de", "format": "xml"}),
        400,
        "xml format is not supported",
    ),
    "too many characters": (
        dict(json={"q": "A dog runs. " * 30, "source": "en", "target": "de"}),
        413,
        "exceeds text limit (300)",
    ),
    "text over max_text_chars": (
        dict(json={"q": ["A dog.", "A dog runs. " * 17], "source": "en", "target": "de"}),
        413,
        "text 1 has 204 characters, over the limit (max_text_chars=200)",
    ),
    "a sentence longer than the model takes": (  # refused, never silently truncated
        dict(json={"q": "a dog runs and " * 12, "source": "en", "target": "de"}),
        413,
        "a sentence has 96 source tokens, over the model's limit (48)",
    ),
    "nested json": (
        dict(content=b"[" * 3900, headers={"content-type": "application/json"}),
        400,
        "Invalid JSON format: nested too deeply",
    ),
    "too many texts": (
        dict(json={"q": ["A dog."] * 9, "source": "en", "target": "de"}),
        413,
        "request (9 texts) exceeds text limit (8)",
    ),
    "body too large": (
        dict(json={"q": "A dog.", "source": "en", "target": "de", "pad": "x" * 5000}),
        413,
        "exceeds the limit (4000)",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_requests_get_a_json_error_and_the_server_stays_healthy(client, name):
    request, status, message = BAD[name]
    r = _translate(client, **request)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"} and message in body["error"]
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def _body(size: int) -> bytes:
    """A valid /translate JSON body of exactly `size` bytes (padded by a field it ignores)."""
    head, tail = b'{"q": "A red dog runs.", "source": "en", "target": "de", "pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _chunked(body: bytes, parts: int = 3):
    """`body` as `parts` chunks, a pause between them so that each reaches the server alone."""
    step = -(-len(body) // parts)
    for start in range(0, len(body), step):
        yield body[start : start + step]
        time.sleep(0.05)


def test_body_limit_at_its_boundary_with_a_content_length(client, reference):
    expected = {"translatedText": reference.translate(SENTENCES[:1], **DECODING)[0]}
    json_type = {"content-type": "application/json"}
    r = _translate(client, content=_body(4000), headers=json_type)  # max_body_bytes=4000
    assert r.request.headers["content-length"] == "4000"
    assert r.status_code == 200 and r.json() == expected
    r = _translate(client, content=_body(4001), headers=json_type)
    assert r.status_code == 413
    assert r.json() == {"error": "Request body of 4001 bytes exceeds the limit (4000)"}


def test_chunked_body_is_counted_across_its_chunks(client, reference):
    """No Content-Length: the running total of the chunks, each far under the limit, counts."""
    expected = {"translatedText": reference.translate(SENTENCES[:1], **DECODING)[0]}
    json_type = {"content-type": "application/json"}
    r = _translate(client, content=_chunked(_body(4000)), headers=json_type)
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in r.request.headers
    assert r.status_code == 200 and r.json() == expected
    r = _translate(client, content=_chunked(_body(4001)), headers=json_type)  # 3 x 1334 bytes
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413
    assert r.json() == {"error": "Request body exceeds the limit (4000 bytes)"}
    assert client.get("/health").json()["status"] == "ok"


def test_read_params_counts_the_running_total_of_the_body_messages():
    """The same limit without a network: the body arrives as 3 ASGI messages, for certain."""
    import asyncio

    from starlette.requests import Request

    from litmt.deploy.server.app import read_params
    from litmt.deploy.server.errors import ApiError

    def request(body: bytes) -> Request:
        messages = [{"type": "http.request", "body": c, "more_body": True} for c in _chunked(body)]
        messages.append({"type": "http.request", "body": b"", "more_body": False})
        assert len(messages) == 4 and all(len(m["body"]) < 2000 for m in messages)

        async def receive() -> dict:
            return messages.pop(0)

        headers = [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")]
        return Request({"type": "http", "method": "POST", "headers": headers}, receive)

    assert asyncio.run(read_params(request(_body(4000)), 4000))["q"] == "A red dog runs."
    with pytest.raises(ApiError, match=r"^Request body exceeds the limit \(4000 bytes\)$") as e:
        asyncio.run(read_params(request(_body(4001)), 4000))
    assert e.value.status == 413


def test_exactly_max_texts_are_translated_and_one_more_is_refused(client, reference):
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(8)]  # max_texts=8
    r = _translate(client, json={"q": texts, "source": "en", "target": "de"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": reference.translate(texts, **DECODING)}
    r = _translate(client, json={"q": [*texts, "A dog."], "source": "en", "target": "de"})
    assert r.status_code == 413
    assert r.json() == {"error": "Invalid request: request (9 texts) exceeds text limit (8)"}


def test_max_chars_counts_all_texts_at_its_boundary(client, reference):
    one = "A dog runs.\n" * 25  # max_chars=300: exactly the limit in one request
    assert len(one) == 300
    r = _translate(client, json={"q": [one], "source": "en", "target": "de"})
    assert r.status_code == 413  # over max_text_chars=200 (per text) first
    assert "(max_text_chars=200)" in r.json()["error"]
    two = [one[:150], one[150:]]  # each text under it, together exactly max_chars
    r = _translate(client, json={"q": two, "source": "en", "target": "de"})
    assert r.status_code == 200
    expected = ["\n".join(reference.translate(t.split("\n"), **DECODING)) for t in two]
    assert r.json() == {"translatedText": expected}
    half = "A red dog runs.\n" * 9 + "A dog."  # 150 characters
    assert len(half) == 150
    r = _translate(client, json={"q": [half, half], "source": "en", "target": "de"})
    assert r.status_code == 200 and len(r.json()["translatedText"]) == 2
    r = _translate(client, json={"q": [half, half + "x"], "source": "en", "target": "de"})
    assert r.status_code == 413  # each text is under the limit, together they are over
    assert r.json() == {"error": "Invalid request: request (301) exceeds text limit (300)"}


def test_attention_max_chars_at_its_boundary_and_its_token_cap(client):
    one = "A dog runs. " * 25
    r = client.post("/attention", json={"q": one + "x"})
    assert r.status_code == 413
    assert r.json() == {"error": "Invalid request: request (301) exceeds text limit (300)"}
    r = client.post("/attention", json={"q": one})  # within max_chars, over the model's 48
    assert r.status_code == 413, r.text  # refused, not truncated to 48 tokens
    assert "over the attention limit (48: attention_max_tokens=256" in r.json()["error"]
    r = client.post("/attention", json={"q": "A dog runs. " * 3})
    assert r.status_code == 200 and r.json()["layers"] == 2


def test_attention_layer_and_head_bounds(client):
    full = client.post("/attention", json={"q": SENTENCES[0], "layer": "all"}).json()
    assert (full["layers"], full["heads"]) == (2, 4)

    def ask(**choice):
        return client.post("/attention", json={"q": SENTENCES[0], **choice})

    last = ask(layer=1, head=3).json()  # the last valid layer and head
    assert (last["layer"], last["head"]) == (1, 3) and last["weights"] == full["weights"][1][3]
    back = ask(layer=-1, head=-4).json()  # negatives count from the end, as in Python
    assert (back["layer"], back["head"]) == (1, 0) and back["weights"] == full["weights"][1][0]
    assert ask(layer=-2, head="mean").json()["layer"] == 0
    refused = [  # one past each end: a 400, never a silent wrap to another layer or head
        ({"layer": 2}, "layer 2 does not exist (the model has 2)"),
        ({"layer": -3}, "layer -3 does not exist (the model has 2)"),
        ({"layer": 0, "head": 4}, "head 4 does not exist (the model has 4)"),
        ({"head": 4}, "head 4 does not exist (the model has 4)"),
        ({"layer": 1, "head": -5}, "head -5 does not exist (the model has 4)"),
    ]
    for choice, message in refused:
        r = ask(**choice)
        assert (r.status_code, r.json()) == (400, {"error": f"Invalid request: {message}"}), choice


def test_decoding_settings_reach_the_translator():
    """serve.yaml's decoding options (max_tokens too) reach every translate call; n_best not."""
    seen: list[dict] = []

    class Spy(_Flaky):
        def translate(self, texts: list[str], **options) -> list[str]:
            seen.append(options)
            return texts

    decoding = {"beam_size": 3, "max_tokens": 7, "n_best": 2}
    app = create_app(Spy(), ServeConfig(max_wait_ms=0, decoding=decoding))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        r = c.post("/translate", json={"q": "fine", "source": "en", "target": "de"})
    assert r.json() == {"translatedText": "fine"}
    assert seen == [{"beam_size": 3, "max_tokens": 7}]


def test_unknown_route_and_method_are_json_errors(client):
    r = client.get("/nope")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = client.get("/translate")
    assert r.status_code == 405 and "error" in r.json()


def test_languages_in_libretranslate_shape(client):
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_attention_route_returns_pieces_and_cross_attention(client, reference):
    r = client.post("/attention", json={"q": SENTENCES[0], "layer": "all"})
    assert r.status_code == 200
    body = r.json()
    assert body["translation"] == reference.translate(SENTENCES[:1], beam_size=1)[0]
    src = reference.tokenizer.src_pieces(reference.prepare(SENTENCES[0]))
    assert body["source_pieces"] == src and body["target_pieces"][-1] == "</s>"
    weights = body["weights"]  # (L, H, T, S)
    assert (len(weights), len(weights[0])) == (body["layers"], body["heads"]) == (2, 4)
    for row in weights[1][2]:  # each target step's attention over the source sums to 1
        assert len(row) == len(src) and sum(row) == pytest.approx(1.0, abs=2e-3)
    assert len(weights[0][0]) == len(body["target_pieces"])
    mean = client.post("/attention", json={"q": SENTENCES[0], "layer": 1, "head": "mean"}).json()
    expected = [
        [sum(weights[1][h][t][s] for h in range(4)) / 4 for s in range(len(src))]
        for t in range(len(body["target_pieces"]))
    ]
    got = [w for row in mean["weights"] for w in row]
    assert got == pytest.approx([w for row in expected for w in row], abs=1e-3)
    one = client.post("/attention", json={"q": SENTENCES[0], "layer": 0, "head": 3}).json()
    assert one["weights"] == weights[0][3]
    default = client.post("/attention", json={"q": SENTENCES[0]}).json()  # one (T, S) map
    assert (default["layer"], default["head"]) == (1, "mean")
    assert default["weights"] == mean["weights"]
    bad = client.post("/attention", json={"q": SENTENCES[0], "layer": 5})
    assert bad.status_code == 400 and "layer 5 does not exist" in bad.json()["error"]
    assert client.post("/attention", json={"q": " "}).status_code == 400


def test_page_is_served(client):
    r = client.get("/")
    assert r.status_code == 200 and 'id="heatmap"' in r.text
    assert client.get("/static/app.js").status_code == 200


def test_ct2_export_is_served_without_attention(ckpt, tmp_path, reference):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from litmt.deploy.export.ct2 import export_model

    out = export_model(ckpt, tmp_path / "ct2")
    app = build_server_app(out, settings=ServeConfig(decoding=DECODING), threads=1)
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        assert c.get("/health").json()["engine"] == "ct2"
        r = c.post("/translate", json={"q": SENTENCES, "source": "en", "target": "de"})
        assert r.json() == {"translatedText": reference.translate(SENTENCES, **DECODING)}
        r = c.post("/attention", json={"q": SENTENCES[0]})
        assert r.status_code == 501 and "serve a .ckpt" in r.json()["error"]


def test_checkpoint_on_ct2_engine_keeps_the_attention_route(ckpt, tmp_path, reference, monkeypatch):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    import contextlib

    import torch

    import litmt.runtime.precision

    threads, entered = [], []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # the explorer's torch model

    def spy(device, dtype):  # the attention maps run in the torch Translator's autocast
        entered.append(dtype)
        return contextlib.nullcontext()

    monkeypatch.setattr(litmt.runtime.precision, "autocast_context", spy)
    settings = ServeConfig(decoding=DECODING)
    app = build_server_app(ckpt, engine="ct2", threads=1, settings=settings, ct2_cache_dir=tmp_path)
    assert threads == [1]
    assert len(list(tmp_path.iterdir())) == 1  # converted into the cache on first use
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        assert c.get("/health").json()["engine"] == "ct2"
        r = c.post("/translate", json={"q": SENTENCES[1], "source": "en", "target": "de"})
        assert r.json() == {"translatedText": reference.translate(SENTENCES[1:2], **DECODING)[0]}
        r = c.post("/attention", json={"q": SENTENCES[1]})
        assert r.status_code == 200 and r.json()["layers"] == 2
    assert entered == [None]  # a sdpa checkpoint on the CPU: fp32, no autocast


class _Flaky:
    """A translator whose batches fail when they contain the word "boom"."""

    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        if any("boom" in t for t in texts):
            raise RuntimeError("kernel exploded")
        return [t.upper() for t in texts]


def test_a_failing_batch_fails_its_request_not_the_server():
    app = create_app(_Flaky(), ServeConfig(max_wait_ms=0))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        r = c.post("/translate", json={"q": "boom", "source": "en", "target": "de"})
        assert r.status_code == 500
        assert re.fullmatch(r"internal error, id [0-9a-f]{12}", r.json()["error"])  # no detail
        r = c.post("/translate", json={"q": "fine", "source": "en", "target": "de"})
        assert r.json() == {"translatedText": "FINE"}
        assert c.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("name", POSITIVE)
def test_settings_are_validated(name):
    with pytest.raises(ConfigError, match=f"{name} must be positive, got 0"):
        ServeConfig(**{name: 0})
    assert getattr(ServeConfig(**{name: 1}), name) == 1


def test_max_wait_ms_may_be_zero_not_negative():
    with pytest.raises(ConfigError, match="max_wait_ms must be >= 0, got -1"):
        ServeConfig(max_wait_ms=-1)
    assert ServeConfig(max_wait_ms=0).max_wait_ms == 0


def _serve_job(monkeypatch, overrides: list[str]) -> tuple[ServeConfig, dict, dict]:
    """scripts/serve.py's job on conf/serve.yaml with `overrides`, the model and uvicorn
    stubbed: (its settings, build_server_app's keywords, uvicorn.run's keywords)."""
    import uvicorn
    from hydra import compose, initialize_config_dir

    import litmt.cli.serve

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="serve", overrides=overrides)
    built: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(litmt.cli.serve, "build_server_app", lambda *a, **k: built.append((a, k)))
    ran: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: ran.append(k))
    litmt.cli.serve.serve(cfg)
    ((args, keywords),) = built
    (run,) = ran
    return keywords["settings"], {"model": args[0], **keywords}, run


def test_serve_yaml_leaves_every_server_setting_at_its_dataclass_default(monkeypatch):
    settings, _, run = _serve_job(monkeypatch, ["ckpt_path=m.ckpt"])
    assert settings == ServeConfig(decoding=settings.decoding)
    assert settings.decoding["max_tokens"] == 4096  # serve.yaml's max_tokens joins them
    assert (run["host"], run["port"]) == ("127.0.0.1", 5000)
    # uvicorn's own limit (plain-text 503) is off; litmt's protocol holds the settings
    assert run["limit_concurrency"] is None and run["proxy_headers"] is False
    assert run["http"].settings.limit_concurrency == 512
    assert run["http"].settings.header_timeout_s == run["http"].settings.body_timeout_s == 10.0


def test_serve_reads_the_shared_load_group_and_refuses_what_it_cannot_serve(monkeypatch):
    """ckpt_path and device come from conf/load/default.yaml; a load key the server cannot
    honour is one line, never silently dropped."""
    _, keywords, _ = _serve_job(monkeypatch, ["ckpt_path=m.ckpt", "device=cpu"])
    assert (keywords["model"], keywords["device"]) == ("m.ckpt", "cpu")
    with pytest.raises(ConfigError, match=r"^serve does not read ensemble=True; drop it$"):
        _serve_job(monkeypatch, ["ckpt_path=m.ckpt", "ensemble=true"])
    with pytest.raises(ConfigError, match=r"^serve does not read tgt_lang=fr; drop it$"):
        _serve_job(monkeypatch, ["ckpt_path=m.ckpt", "tgt_lang=fr"])
    with pytest.raises(ConfigError, match=r"^serve takes one model, got ckpt_path=\['a.ckpt', "):
        _serve_job(monkeypatch, ["ckpt_path=[a.ckpt,b.ckpt]"])
    with pytest.raises(ConfigError, match=r"^no model given: pass ckpt_path="):
        _serve_job(monkeypatch, [])


@pytest.mark.parametrize(
    ("old", "new", "read"),
    [
        ("model_path=m.ckpt", "ckpt_path", lambda s, k: k["model"] == "m.ckpt"),
        ("max_batch_texts=3", "max_batch_sentences", lambda s, k: s.max_batch_sentences == 3),
        ("req_limit=7", "access.req_limit", lambda s, k: s.access.req_limit == 7),
    ],
)  # fmt: skip
def test_an_old_key_spelling_still_works_with_a_deprecation_line(
    monkeypatch, caplog, old, new, read
):
    overrides = [old] if old.startswith("model_path") else ["ckpt_path=m.ckpt", old]
    with caplog.at_level(logging.WARNING, logger="litmt.config"):
        settings, keywords, _ = _serve_job(monkeypatch, overrides)
    assert read(settings, keywords)
    name = old.split("=")[0]
    assert caplog.messages == [
        f"serve: {name} is deprecated and will be removed in litmt 0.3.0; use {new}"
    ]


def test_an_old_and_a_new_spelling_that_disagree_are_refused(monkeypatch):
    with pytest.raises(
        ConfigError, match=r"^serve: req_limit is the old name of access\.req_limit"
    ):
        _serve_job(monkeypatch, ["ckpt_path=m.ckpt", "req_limit=7", "access.req_limit=8"])
    with pytest.raises(ConfigError, match=r"^serve: max_batch_texts is the old name"):
        _serve_job(monkeypatch, ["ckpt_path=m.ckpt", "max_batch_texts=3", "max_batch_sentences=4"])


def test_build_server_app_attention_is_the_old_name_of_explorer(ckpt, caplog):
    with caplog.at_level(logging.WARNING, logger="litmt.config"):
        app = build_server_app(ckpt, device="cpu", attention=False)
    assert caplog.messages == [
        "build_server_app: attention is deprecated and will be removed in litmt 0.3.0; use explorer"
    ]
    with TestClient(app) as c:
        assert c.get("/health").json()["attention"] is False
        r = c.post("/attention", json={"q": "A red dog runs."})
        assert r.status_code == 501


def test_an_unknown_or_bad_server_key_is_one_line():
    from litmt.cli.serve import serve_config

    with pytest.raises(ConfigError, match=r"^unknown serve keys \['max_text'\] \(did you mean"):
        serve_config({"max_text": 3, "max_tokens": 8})
    with pytest.raises(ConfigError, match=r"^unknown serve.access keys \['req_limt'\]"):
        serve_config({"access": {"req_limt": 3}})
    with pytest.raises(ConfigError, match=r"^max_texts must be a number, got 'many'$"):
        serve_config({"max_texts": "many"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_script_starts_answers_and_enforces_a_limit_of_its_command_line(ckpt):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "serve.py"), f"ckpt_path={ckpt}", f"port={port}",
         "log_level=warning", "decoding.beam_size=1", "max_texts=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.3)
        assert health.json()["status"] == "ok"
        r = httpx.post(
            f"http://127.0.0.1:{port}/translate",
            content=json.dumps({"q": "A red dog runs.", "source": "en", "target": "de"}),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["translatedText"]
        r = httpx.post(
            f"http://127.0.0.1:{port}/translate",
            json={"q": ["A red dog runs.", "A cat."], "source": "en", "target": "de"},
            timeout=30,
        )
        assert r.status_code == 413, r.text
        assert r.json() == {"error": "Invalid request: request (2 texts) exceeds text limit (1)"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_script_without_model_is_one_line_exit_2():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "serve.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: no model given: pass ckpt_path=<a .ckpt file or a CTranslate2 export directory>"
    ]


@pytest.mark.slow
def test_benchmark_server_smoke(ckpt, tmp_path):
    (tmp_path / "test.en").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_server", "--smoke",
         "--model", str(ckpt), "--src", str(tmp_path / "test.en"), "--threads", "1",
         "--json", str(tmp_path / "r.json"), "--soak", "4", "--soak-concurrency", "4",
         "--rss-every", "1", "--mix", "--explorer"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["rows"]
    assert [(r["concurrency"], r["requests"], r["status"]) for r in rows] == [
        (1, 8, {"200": 8}),
        (4, 8, {"200": 8}),
    ]
    assert all(0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] for r in rows)
    soaked = result["soak"]
    assert soaked["seconds"] >= 4
    by_kind = soaked["by_kind"]  # the mix: each kind gets its answer, bad input a 400
    assert set(by_kind) <= {"plain", "alternatives", "prefix", "attention", "bad", "hangup"}
    assert {"plain", "bad"} <= set(by_kind)
    for kind, codes in by_kind.items():
        expected = {"bad": "400", "hangup": "hung up"}.get(kind, "200")
        assert set(codes) == {expected}, (kind, codes)
    assert soaked["rss_before_mb"] > 50 and soaked["rss_after_mb"] > 50  # the server's, not 0
    assert len(soaked["rss_samples"]) >= 2
    assert "| concurrency | requests | requests/s | p50 (ms) | p95 (ms) | p99 (ms) |" in run.stdout
    assert "Soak: " in run.stdout and "| growth after 1 min |" in run.stdout
    assert "5xx other than 503, or unanswered: none" in run.stdout


def _run_batcher(fn, requests: list[list[str]], *, max_batch_sentences: int, max_wait_ms: float):
    """Submit `requests` at once to a ModelQueue as jobs of one key; (results or
    exceptions, queue)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor as Pool

    from litmt.deploy.server.model_queue import Job, ModelQueue

    async def main():
        with Pool(1) as pool:
            queue = ModelQueue(
                pool, max_batch_sentences=max_batch_sentences, max_wait_ms=max_wait_ms,
                max_queue=64,
            )  # fmt: skip
            queue.start()
            try:
                futures = [queue.submit(Job(fn, texts, key="k")) for texts in requests]
                return await asyncio.gather(*futures, return_exceptions=True), queue
            finally:
                await queue.stop()

    return asyncio.run(main())


def test_batcher_survives_a_request_that_goes_away_while_its_batch_fails():
    """A client that goes (a timeout, a shutdown) while its one-request batch fails must not
    kill the batcher: the next request is still answered."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor as Pool

    from litmt.deploy.server.model_queue import Job, ModelQueue

    running, release = threading.Event(), threading.Event()

    def fn(texts: list[str]) -> list[str]:
        if texts == ["bad"]:
            running.set()
            release.wait(5)
            raise ValueError("boom")
        return [t.upper() for t in texts]

    async def main():
        loop = asyncio.get_running_loop()
        with Pool(1) as pool:
            queue = ModelQueue(pool, max_batch_sentences=4, max_wait_ms=1, max_queue=8)
            queue.start()
            try:
                doomed = queue.submit(Job(fn, ["bad"], key="k"))
                await loop.run_in_executor(None, running.wait, 5)
                doomed.cancel()  # the client goes while its batch runs
                await asyncio.gather(doomed, return_exceptions=True)
                release.set()  # now the batch fails
                return await asyncio.wait_for(queue.submit(Job(fn, ["ok"], key="k")), 3)
            finally:
                release.set()
                await queue.stop()

    assert asyncio.run(main()) == ["OK"]


def test_batcher_merges_concurrent_requests_and_splits_results_back():
    calls: list[list[str]] = []

    def fn(texts: list[str]) -> list[str]:
        calls.append(list(texts))
        return [t.upper() for t in texts]

    requests = [["a"], ["b", "c"], ["d"]]
    results, batcher = _run_batcher(fn, requests, max_batch_sentences=16, max_wait_ms=100)
    assert results == [["A"], ["B", "C"], ["D"]]
    assert calls == [["a", "b", "c", "d"]]
    assert (batcher.batches, batcher.largest_batch) == (1, 3)


def test_batcher_never_exceeds_max_batch_sentences():
    calls: list[list[str]] = []

    def fn(texts: list[str]) -> list[str]:
        calls.append(list(texts))
        return texts

    requests = [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h", "i", "j", "k"]]
    results, _ = _run_batcher(fn, requests, max_batch_sentences=4, max_wait_ms=100)
    assert results == requests
    assert [len(c) for c in calls] == [4, 2, 5]  # a larger request runs alone


def test_batcher_failure_fails_only_the_bad_request():
    def fn(texts: list[str]) -> list[str]:
        if "boom" in texts:
            raise RuntimeError("kernel exploded")
        return texts

    results, _ = _run_batcher(
        fn, [["ok"], ["boom"], ["fine"]], max_batch_sentences=16, max_wait_ms=100
    )
    assert results[0] == ["ok"] and results[2] == ["fine"]
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "kernel exploded"


def test_batcher_runs_a_full_batch_at_once_and_a_lone_request_after_max_wait():
    def timed(requests: list[list[str]], max_wait_ms: float) -> float:
        start = time.monotonic()
        results, _ = _run_batcher(
            lambda t: t, requests, max_batch_sentences=4, max_wait_ms=max_wait_ms
        )
        assert results == requests
        return time.monotonic() - start

    # the queue's own cost in this run (start, one batch, stop), with no waiting at all: the
    # bounds below are that plus a fraction of the 10 s wait a full batch must skip, so a
    # loaded machine slows the baseline and the measured runs alike
    baseline = statistics.median(timed([["a", "b", "c", "d"]], max_wait_ms=0) for _ in range(3))
    skipped_wait_s = 10.0
    slack = skipped_wait_s / 2
    # a full batch (one request of 4, or two that fill it) runs at once: no wait
    assert timed([["a", "b", "c", "d"]], max_wait_ms=skipped_wait_s * 1000) < baseline + slack
    assert timed([["a", "b"], ["c", "d"]], max_wait_ms=skipped_wait_s * 1000) < baseline + slack
    # a lone request waits max_wait_ms (0.5 s) for company, and then runs
    assert 0.45 <= timed([["a"]], max_wait_ms=500) < baseline + 0.5 + slack


# -- holding under abuse (issue 24) -----------------------------------------------------
class _Gated(_Flaky):
    """A translator that blocks in every call until `gate` is set; `calls` records the texts."""

    def __init__(self) -> None:
        import threading

        self.gate, self.entered, self.calls = threading.Event(), threading.Event(), []

    def translate(self, texts: list[str], **options) -> list[str]:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return [t.upper() for t in texts]


def _ask(url: str, text: str, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        url + "/translate", json={"q": text, "source": "en", "target": "de"}, timeout=timeout
    )


def _until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)


def test_a_full_queue_gives_503_with_retry_after_then_the_server_recovers():
    model = _Gated()
    app = create_app(model, ServeConfig(max_batch_sentences=1, max_wait_ms=0, max_queue=2))
    with ServerThread(app) as running, ThreadPoolExecutor(8) as pool:
        health = lambda: httpx.get(running.url + "/health").json()  # noqa: E731
        first = pool.submit(_ask, running.url, "one")
        assert model.entered.wait(10)  # the model is busy with "one"
        queued = [pool.submit(_ask, running.url, t) for t in ("two", "three")]
        _until(lambda: health()["queued"] == 2)
        refused = [_ask(running.url, "four") for _ in range(3)]
        for r in refused:
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json() == {"error": "Server busy: too many requests are waiting; retry later"}
        model.gate.set()
        assert first.result().json() == {"translatedText": "ONE"}
        assert [f.result().json()["translatedText"] for f in queued] == ["TWO", "THREE"]
        assert _ask(running.url, "five").json() == {"translatedText": "FIVE"}  # recovered
        after = health()
        assert (after["status"], after["rejected"], after["queued"]) == ("ok", 3, 0)


def test_twenty_clients_that_disconnect_have_their_queued_work_skipped():
    model = _Gated()
    app = create_app(model, ServeConfig(max_wait_ms=0))
    with ServerThread(app) as running, ThreadPoolExecutor(1) as pool:
        health = lambda: httpx.get(running.url + "/health").json()  # noqa: E731
        busy = pool.submit(_ask, running.url, "busy")
        assert model.entered.wait(10)
        body = json.dumps({"q": "gone", "source": "en", "target": "de"}).encode()
        head = (f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        clients = []
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", running.port))
            sock.sendall(head + body)
            clients.append(sock)
        _until(lambda: health()["queued"] == 20)
        for sock in clients:  # each client hangs up while its request waits
            sock.close()
        time.sleep(1.0)  # the server notices each disconnect (uvicorn: connection_lost)
        model.gate.set()
        assert busy.result().json() == {"translatedText": "BUSY"}
        _until(lambda: health()["skipped"] == 20)
        assert _ask(running.url, "after").json() == {"translatedText": "AFTER"}
    assert model.calls == [["busy"], ["after"]]  # nothing was decoded for the 20


def test_a_request_over_its_timeout_gets_504_and_the_server_lives_on():
    model = _Gated()
    app = create_app(model, ServeConfig(max_wait_ms=0, request_timeout_s=0.3))
    with ServerThread(app) as running:
        r = _ask(running.url, "slow")
        assert r.status_code == 504
        assert r.json() == {"error": "Translation timed out (request_timeout_s=0.3)"}
        model.gate.set()
        assert _ask(running.url, "fine").json() == {"translatedText": "FINE"}


def test_health_is_503_when_the_model_queue_has_died():
    app = create_app(_Flaky(), ServeConfig(max_wait_ms=0))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
        task = app.state.context.admission.queue._task
        task.get_loop().call_soon_threadsafe(task.cancel)  # as if it had crashed
        _until(task.done)
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"].startswith("unavailable")
        r = c.post("/translate", json={"q": "fine", "source": "en", "target": "de"})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert r.json() == {"error": "Server unavailable: the model queue has stopped"}


def test_batcher_loop_survives_an_error_outside_the_model_call():
    """A bug in batching itself (here: a result list of the wrong type) fails that batch's
    requests; the loop goes on and answers the next one."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor as Pool

    from litmt.deploy.server.model_queue import Job, ModelQueue

    def fn(texts: list[str]) -> list[str]:
        return None if texts == ["bad"] else texts  # None[0:1]: TypeError in the loop

    async def main():
        with Pool(1) as pool:
            queue = ModelQueue(pool, max_batch_sentences=4, max_wait_ms=0, max_queue=8)
            queue.start()
            try:
                bad = await asyncio.wait_for(
                    asyncio.gather(queue.submit(Job(fn, ["bad"], key="k")), return_exceptions=True),
                    3,
                )
                good = await asyncio.wait_for(queue.submit(Job(fn, ["ok"], key="k")), 3)
                return bad, good, queue.alive
            finally:
                await queue.stop()

    (bad,), good, alive = asyncio.run(main())
    assert isinstance(bad, TypeError) and good == ["ok"] and alive


def test_shutdown_drains_a_request_in_flight():
    """uvicorn's SIGTERM handler sets should_exit; the request being decoded still gets its
    answer within timeout_graceful_shutdown."""
    model = _Gated()
    app = create_app(model, ServeConfig(max_wait_ms=0))
    server = ServerThread(app, timeout_graceful_shutdown=10)
    with server, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_ask, server.url, "last")
        assert model.entered.wait(10)
        server.server.should_exit = True  # what SIGTERM does (uvicorn Server.handle_exit)
        time.sleep(0.3)
        model.gate.set()
        r = answer.result()
    assert r.status_code == 200 and r.json() == {"translatedText": "LAST"}


def test_a_2500_line_text_and_deeply_nested_json_get_json_4xx():
    app = create_app(_Flaky(), ServeConfig(max_wait_ms=0))  # the defaults of serve.yaml
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        text = "\n".join(["a"] * 2500)  # 4,999 characters: within max_chars=5000
        r = c.post("/translate", json={"q": text, "source": "en", "target": "de"})
        assert r.status_code == 413
        assert r.json() == {
            "error": "Invalid request: text 0 has 2500 lines, over the limit (max_lines=100)"
        }
        nested = b"[" * 900_000  # within max_body_bytes=1000000
        for route in ("/translate", "/attention"):
            r = c.post(route, content=nested, headers={"content-type": "application/json"})
            if route == "/attention":  # no torch model here: 501 comes first
                assert r.status_code == 501
                continue
            assert r.status_code == 400 and r.headers["content-type"] == "application/json"
            assert r.json() == {"error": "Invalid JSON format: nested too deeply"}
        assert c.get("/health").json()["status"] == "ok"


def test_max_source_tokens_counts_every_line_of_the_request(reference):
    app = create_app(reference, ServeConfig(max_wait_ms=0, max_source_tokens=20))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        n = len(reference.tokenizer.encode_src([SENTENCES[1]])[0])
        fits = [SENTENCES[1]] * (20 // n)
        r = c.post("/translate", json={"q": fits, "source": "en", "target": "de"})
        assert r.status_code == 200
        over = [*fits, SENTENCES[1]]
        r = c.post("/translate", json={"q": over, "source": "en", "target": "de"})
        assert r.status_code == 413
        assert r.json() == {
            "error": f"Invalid request: {n * len(over)} source tokens, over the limit "
            "(max_source_tokens=20)"
        }


LONG_LINE = " ".join(SENTENCES * 2)  # 8 sentences on one line: over the model's 48 tokens


def test_a_line_over_the_model_limit_is_translated_sentence_by_sentence(client, reference):
    assert len(reference.tokenizer.encode_src([LONG_LINE])[0]) > reference.max_source_tokens
    before = client.get("/health").json()["split_lines"]
    r = _translate(client, json={"q": [LONG_LINE, SENTENCES[0]], "source": "en", "target": "de"})
    assert r.status_code == 200, r.text
    each = reference.translate(SENTENCES, **DECODING)
    assert r.json()["translatedText"] == [" ".join(each * 2), each[0]]
    assert client.get("/health").json()["split_lines"] == before + 1
    # multi-line text: each line keeps its place; only the long one is split
    text = f"{SENTENCES[0]}\n{LONG_LINE}"
    r = _translate(client, json={"q": text, "source": "en", "target": "de"})
    assert r.json()["translatedText"] == f"{each[0]}\n{' '.join(each * 2)}"
    # alternatives: the n-best of each sentence, joined per rank
    r = _translate(client, json={"q": LONG_LINE, "source": "en", "target": "de", "alternatives": 1})
    assert r.status_code == 200 and r.json()["translatedText"] == " ".join(each * 2)
    assert len(r.json()["alternatives"]) == 1


@pytest.mark.parametrize(
    ("mode", "status"), [("never", 413), ("always", 200)], ids=["never", "always"]
)
def test_split_sentences_never_refuses_and_always_splits_every_line(reference, mode, status):
    settings = ServeConfig(max_wait_ms=0, split_sentences=mode, decoding=DECODING)
    app = create_app(reference, settings)
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        r = c.post("/translate", json={"q": LONG_LINE, "source": "en", "target": "de"})
        assert r.status_code == status, r.text
        if mode == "never":
            n = len(reference.tokenizer.encode_src([LONG_LINE])[0])
            assert r.json() == {
                "error": f"Invalid request: a line has {n} source tokens, over the model's "
                f"limit ({reference.max_source_tokens}); set split_sentences=long"
            }
        two = f"{SENTENCES[0]}  {SENTENCES[1]}"  # two sentences, far under the limit
        r = c.post("/translate", json={"q": two, "source": "en", "target": "de"})
        each = reference.translate(SENTENCES[:2], **DECODING)
        whole = reference.translate([two], **DECODING)[0]
        assert r.json()["translatedText"] == (
            f"{each[0]}  {each[1]}" if mode == "always" else whole
        )


def test_bad_decoding_option_is_refused_when_the_app_is_built():
    with pytest.raises(ConfigError, match=r"^decoding: beam_size must be at least 1, got 0$"):
        ServeConfig(decoding={"beam_size": 0})
    with pytest.raises(ConfigError, match="decoding: decoding option top_p must be of type"):
        create_app(_Flaky(), ServeConfig(decoding={"top_p": "high"}))


def test_serve_script_with_a_bad_decoding_option_is_one_line_exit_2(ckpt):
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "serve.py"), f"ckpt_path={ckpt}",
         "decoding.beam_size=0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "error: decoding: beam_size must be at least 1, got 0"
    ]


@pytest.fixture(scope="module")
def long_ckpt(tmp_path_factory) -> Path:
    """A barely trained tiny model that takes 600 source positions (for long /attention)."""
    from tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("long"), steps=3, max_positions=600)


def _health_latency(client: httpx.Client) -> float:
    """Seconds one GET /health takes (it must answer 200)."""
    t0 = time.perf_counter()
    assert client.get("/health").status_code == 200
    return time.perf_counter() - t0


@pytest.mark.slow
def test_health_answers_fast_while_a_1000_character_attention_request_is_served(long_ckpt):
    """/health never waits for the model: while a 1000-character /attention request is
    decoded, a typical /health answer is within a generous factor of one on the idle server
    and a small fraction of the decoding. Medians, both measured in this run (a loaded
    machine slows both alike); a /health that waited for the model would answer once or
    twice, each taking about as long as the decoding."""
    text = ("A big man sleeps here and a small cat eats today. " * 20)[:1000]
    settings = ServeConfig(max_wait_ms=0, max_chars=1000, attention_max_tokens=600)
    app = build_server_app(long_ckpt, device="cpu", settings=settings)
    with (
        ServerThread(app) as running,
        ThreadPoolExecutor(1) as pool,
        httpx.Client(base_url=running.url, timeout=60) as c,
        httpx.Client(base_url=running.url, timeout=60) as h,
    ):
        h.get("/health")  # connection warm
        idle = statistics.median(_health_latency(h) for _ in range(20))
        start = time.perf_counter()
        big = pool.submit(c.post, "/attention", json={"q": text, "layer": "all"})
        latencies = []
        while not big.done():
            latencies.append(_health_latency(h))
            time.sleep(0.02)
        r = big.result()
        took = time.perf_counter() - start
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["source_pieces"]) > 256 and len(body["weights"]) == body["layers"]
    busy = statistics.median(latencies) if latencies else took
    seen = (
        f"{len(latencies)} /health answers in {took:.2f}s, median {busy * 1000:.1f} ms "
        f"(idle: {idle * 1000:.1f} ms), slowest {[round(x * 1000) for x in sorted(latencies)[-3:]]} ms"
    )
    assert len(latencies) >= 5, f"the loop was blocked: {seen}"
    assert busy < took / 10, f"/health waited for the model: {seen}"
    assert busy < max(20 * idle, took / 50), f"/health slowed by the decoding: {seen}"


def test_attention_caps_its_source_and_its_target(long_ckpt):
    text = ("A big man sleeps here and a small cat eats today. " * 20)[:1000]
    app = build_server_app(long_ckpt, device="cpu", settings=ServeConfig(max_wait_ms=0))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        r = c.post("/attention", json={"q": text})
        assert r.status_code == 413
        assert "over the attention limit (256: attention_max_tokens=256" in r.json()["error"]
        r = c.post("/attention", json={"q": text[:300]})
        assert r.status_code == 200, r.text
        body = r.json()  # an untrained model babbles to its budget
        assert len(body["target_pieces"]) <= 256 + 1  # the budget (<= 256) and its eos
        assert (body["layer"], body["head"]) == (1, "mean")  # one (T, S) map by default
        assert len(body["weights"]) == len(body["target_pieces"])


SLOW_SERVER = """
import sys, time, uvicorn
from litmt.deploy.server.app import ServeConfig, create_app

class Slow:
    src_lang, tgt_lang = "en", "de"
    def translate(self, texts, **options):
        print("decoding", flush=True)
        time.sleep(float(sys.argv[2]))
        return [t.upper() for t in texts]

app = create_app(Slow(), ServeConfig(max_wait_ms=0))
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", timeout_graceful_shutdown=10)
print("stopped", flush=True)  # not reached: uvicorn re-raises SIGTERM after the drain
"""


def test_sigterm_lets_the_request_in_flight_finish():
    """A real SIGTERM to a uvicorn process: the request being decoded gets its 200 within
    timeout_graceful_shutdown, then the process ends by the signal."""
    import signal

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SERVER, str(port), "1.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_ask, f"http://127.0.0.1:{port}", "last")
            assert proc.stdout.readline().strip() == "decoding"
            proc.send_signal(signal.SIGTERM)
            r = answer.result()
        assert r.status_code == 200 and r.json() == {"translatedText": "LAST"}
        out, err = proc.communicate(timeout=30)
        # uvicorn re-raises the signal once its graceful shutdown is done (capture_signals)
        assert proc.returncode == -signal.SIGTERM, err
        assert "graceful shutdown exceeded" not in err and "stopped" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
