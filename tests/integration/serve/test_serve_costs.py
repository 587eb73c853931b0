"""Costs the admission sees, against a real uvicorn on loopback: constraints are capped
before anything is queued (``max_constraints``, ``max_constraint_pieces``), and a job the
estimate (source tokens times beam) says could not finish within ``request_timeout_s`` even
alone is refused up front with 503 and ``Retry-After``."""

from __future__ import annotations

import threading
import time

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import ServeConfig, build_server_app  # noqa: E402

PAIR = {"source": "en", "target": "de"}


@pytest.fixture(scope="module")
def server(ckpt):
    settings = ServeConfig(decoding={"beam_size": 3}, request_timeout_s=10)
    app = build_server_app(ckpt, device="cpu", settings=settings)
    with ServerThread(app) as running:
        yield running


@pytest.mark.parametrize("times", [255, 10])
def test_a_request_over_the_constraint_caps_is_refused_up_front_and_others_are_served(
    server, times
):
    """The issue's probe: 64 sentences, each with one term listed 255 times (a beam of 256
    and an output budget of 255 each), about 80 KB; and 10 times, which fits the tiny
    model's output limit (without the cap it is decoded: 64 sentences at beam 21)."""
    flood = {"q": ["a"] * 64, "constraints": [["der"] * times] * 64, **PAIR}
    answers: dict[str, tuple[int, dict, float]] = {}

    def send(name: str, body: dict) -> None:
        start = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = c.post("/translate", json=body)
        answers[name] = (r.status_code, r.json(), time.monotonic() - start)

    big = threading.Thread(target=send, args=("flood", flood))
    big.start()
    time.sleep(0.2)
    send("plain", {"q": "A red dog runs.", **PAIR})  # another client, sent meanwhile
    big.join(timeout=40)
    status, body, took = answers["flood"]
    assert status == 400, body
    assert "max_constraints=8" in body["error"] and f"{times} constraints" in body["error"]
    assert took < 5
    status, body, took = answers["plain"]
    assert status == 200 and isinstance(body["translatedText"], str), body
    assert took < 10


def test_constraint_pieces_over_the_cap_are_a_400_naming_the_key(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post(
            "/translate",
            json={"q": "A dog.", "constraints": ["der die das " * 12], **PAIR},
        )
        assert r.status_code == 400, r.text
        assert "max_constraint_pieces=32" in r.json()["error"]
        ok = c.post("/translate", json={"q": "A dog.", "constraints": ["Hund"], **PAIR})
        assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def tight(ckpt):
    settings = ServeConfig(decoding={"beam_size": 3}, request_timeout_s=1)
    app = build_server_app(ckpt, device="cpu", settings=settings)
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        yield c


def test_a_job_that_could_not_finish_even_alone_is_refused_up_front(tight):
    """Once plain batches are timed, 64 long lines (thousands of source tokens x beam 3) are
    priced far past request_timeout_s=1: 503 with Retry-After at once, not a 504 later."""
    for _ in range(2):  # two timed batches: the rate is known
        first = tight.post("/translate", json={"q": "A dog.", **PAIR})
        assert first.status_code == 200, first.text
    long = " ".join(["a"] * 24)
    start = time.monotonic()
    r = tight.post("/translate", json={"q": [long] * 64, **PAIR})
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] and "request_timeout_s=1" in r.json()["error"]
    assert time.monotonic() - start < 1
    assert tight.get("/health").json()["shed"] >= 1
    again = tight.post("/translate", json={"q": "A dog.", **PAIR})
    assert again.status_code == 200, again.text
