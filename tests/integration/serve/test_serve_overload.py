"""Overload probes against a real uvicorn on loopback: every kind of request meets the one
bounded queue (alternatives, prefix/constraints, /attention), overload is a 503 with
Retry-After instead of a 504, and alternatives share batches.

The translator is a stand-in with a fixed cost per call and per sentence, so the probes load
the server the way a real model does without depending on this machine's speed."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from benchmarks.http_load import client_address  # noqa: E402
from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402

LONG = " ".join(f"Sentence number {i} is here." for i in range(12))  # 12 sentences, one line


class _Costly:
    """A translator that takes ``call_s + per_sentence_s * len(texts)`` per call (the shape
    of a batched model) and answers upper case; n-best lists have `n_best` variants."""

    src_lang, tgt_lang = "en", "de"

    def __init__(self, call_s: float = 0.02, per_sentence_s: float = 0.01) -> None:
        self.call_s, self.per_sentence_s = call_s, per_sentence_s
        self.calls: list[int] = []  # sentences per call
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def translate(self, texts: list[str], n_best: int = 1, **options: Any) -> list[Any]:
        self.entered.set()
        assert self.gate.wait(30)
        self.calls.append(len(texts))
        time.sleep(self.call_s + self.per_sentence_s * len(texts))
        if n_best == 1:
            return [t.upper() for t in texts]
        return [[(f"{t.upper()} v{k}", -float(k)) for k in range(n_best)] for t in texts]


def _client(i: int, url: str) -> httpx.Client:
    """A client of its own loopback address (127.0.x.y), as distinct users are (the load
    benchmark's rule)."""
    address = client_address(i, "127.0.0.1")
    return httpx.Client(
        base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=address)
    )


def _burst(url: str, n: int, body: dict[str, Any], path: str = "/translate") -> list[Any]:
    """`n` clients at once, each one request; their responses."""
    start = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        with _client(i, url) as c:
            start.wait(30)
            return c.post(path, json=body)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_200_concurrent_alternatives_requests_get_503_with_retry_after_not_504():
    """The issue's queue probe: alternatives=3 with a 12-sentence text, max_queue=8,
    request_timeout_s=5. Before, alternatives bypassed the queue: 170 x 504, no 503."""
    model = _Costly()
    settings = ServeConfig(
        max_queue=8, request_timeout_s=5, decoding={"beam_size": 4}, max_connections_per_client=0
    )
    app = create_app(model, settings)
    body = {"q": LONG, "source": "en", "target": "de", "alternatives": 3}
    with ServerThread(app) as running:
        started = time.monotonic()
        responses = _burst(running.url, 200, body)
        took = time.monotonic() - started
        health = httpx.get(running.url + "/health").json()
    codes = Counter(r.status_code for r in responses)
    assert set(codes) <= {200, 503}, codes  # no 504: nothing was queued to die
    assert codes[503] > 0 and codes[200] > 0, codes
    for r in responses:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"].startswith("Server busy: ")
        else:
            assert len(r.json()["alternatives"]) == 3
    assert health["rejected"] + health["shed"] == codes[503]
    assert health["timed_out"] == 0
    # refusals come at once, not after request_timeout_s: a typical refusal is answered well
    # within it, and sooner than a typical served request (which waits its turn in the
    # queue); medians of this run, so a loaded machine slows both sides alike
    refused = statistics.median(
        r.elapsed.total_seconds() for r in responses if r.status_code == 503
    )
    served = statistics.median(r.elapsed.total_seconds() for r in responses if r.status_code == 200)
    seen = f"median 503 {refused:.3f}s, median 200 {served:.3f}s, all {took:.1f}s"
    assert refused < settings.request_timeout_s / 2, seen
    assert refused < served, seen


def test_alternatives_requests_share_batches():
    model = _Costly(call_s=0.2, per_sentence_s=0.0)
    app = create_app(model, ServeConfig(max_wait_ms=300, decoding={"beam_size": 4}))
    body = {"q": "One sentence.", "source": "en", "target": "de", "alternatives": 2}
    with ServerThread(app) as running:
        responses = _burst(running.url, 8, body)
        health = httpx.get(running.url + "/health").json()
    assert [r.status_code for r in responses] == [200] * 8
    assert responses[0].json()["alternatives"] == ["ONE SENTENCE. v1", "ONE SENTENCE. v2"]
    assert health["largest_batch"] > 1 and len(model.calls) < 8  # n-best lists were merged


def test_steered_and_attention_requests_wait_in_the_same_bounded_queue():
    """While the model is busy, a full queue refuses a prefix request and an /attention
    request with 503 + Retry-After (before: they went straight to an unbounded executor)."""
    model = _Costly()
    model.gate.clear()
    app = create_app(model, ServeConfig(max_queue=1, max_wait_ms=0, max_batch_sentences=1))
    with ServerThread(app) as running, ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            httpx.post, running.url + "/translate", json={"q": "a", "source": "en", "target": "de"}
        )
        assert model.entered.wait(10)  # "a" is in the model's thread, blocked at the gate
        second = pool.submit(
            httpx.post, running.url + "/translate", json={"q": "b", "source": "en", "target": "de"}
        )
        _until(lambda: _health(running.url)["queued"] == 1)
        steered = httpx.post(
            running.url + "/translate",
            json={"q": "c", "source": "en", "target": "de", "prefix": "C"},
        )
        model.gate.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert steered.status_code == 503 and steered.headers["retry-after"] == "1"
    assert steered.json() == {"error": "Server busy: too many requests are waiting; retry later"}


def test_attention_has_the_request_timeout(ckpt):
    """/attention waits in the queue like any request: past request_timeout_s it is a 504
    and its work is dropped (before: no timeout at all)."""
    from litmt.deploy.loader import load_translator

    model = _Costly()
    model.gate.clear()
    attention_model = load_translator(ckpt, engine="torch", device="cpu")
    settings = ServeConfig(request_timeout_s=2, max_wait_ms=0)
    app = create_app(model, settings, attention_model=attention_model)
    with ServerThread(app) as running, ThreadPoolExecutor(1) as pool:
        busy = pool.submit(
            httpx.post, running.url + "/translate", json={"q": "a", "source": "en", "target": "de"}
        )
        assert model.entered.wait(10)  # "a" holds the model's thread
        r = httpx.post(running.url + "/attention", json={"q": "A red dog runs."}, timeout=30)
        model.gate.set()
        assert busy.result().status_code == 504  # it waited at the gate past 2 s too
        assert r.status_code == 504
        assert r.json() == {"error": "Translation timed out (request_timeout_s=2)"}
        ok = httpx.post(running.url + "/translate", json={"q": "b", "source": "en", "target": "de"})
        assert ok.json() == {"translatedText": "B"}  # the server lives on
        health = _health(running.url)
        assert (health["timed_out"], health["skipped"]) == (2, 1)  # /attention: never decoded


def _health(url: str) -> dict[str, Any]:
    return httpx.get(url + "/health", timeout=10).json()


def _until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)
