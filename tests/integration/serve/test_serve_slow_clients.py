"""Slow and idle clients against a real uvicorn on loopback, run as `litmt.cli.serve` runs
it (litmt's HTTP protocol, `litmt.deploy.server.protocol`): stalled sockets cannot lock other
clients out, every refusal a client can read is JSON, and header and body deadlines close
what stalls.

Distinct users are distinct loopback addresses (127.0.x.y), which Linux routes to the
server like any other peer."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402

HALF = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # no end
ASK = {"q": "fine", "source": "en", "target": "de"}


class _Upper:
    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        return [t.upper() for t in texts]


@contextmanager
def _stalled(port: int, n: int, *, spread: bool, data: bytes = HALF) -> Iterator[list]:
    """`n` sockets that sent `data` (half a request) and stall; from `n` addresses when
    `spread`, else all from 127.0.0.2."""
    socks = []
    try:
        for i in range(n):
            host = f"127.0.{10 + i // 250}.{1 + i % 250}" if spread else "127.0.0.2"
            sock = socket.create_connection(("127.0.0.1", port), source_address=(host, 0))
            sock.sendall(data)
            socks.append(sock)
        time.sleep(0.5)  # the server has accepted them all
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _answer(sock: socket.socket, timeout: float) -> bytes:
    """What the server wrote before it closed `sock` (b"" if it wrote nothing)."""
    sock.settimeout(timeout)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _json_body(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_80_stalled_sockets_do_not_lock_out_a_well_behaved_client(caplog):
    """The issue's slow-client probe: limit_concurrency=64 and 80 sockets that sent half a
    request from one address. Before: /health and /translate got uvicorn's plain-text 503."""
    import litmt.deploy.server.protocol as protocol

    protocol._warned.clear()
    settings = ServeConfig(limit_concurrency=64, header_timeout_s=30)
    app = create_app(_Upper(), settings)
    with (
        ServerThread(app) as running,
        _stalled(running.port, 80, spread=False),
        httpx.Client(base_url=running.url, timeout=10) as c,
    ):
        assert c.get("/health").status_code == 200
        assert c.post("/translate", json=ASK).json() == {"translatedText": "FINE"}
    refusals = [r for r in caplog.records if r.name == protocol.__name__]
    assert len(refusals) == 1  # 48 refused connections, one log line (WARN_EVERY_S)
    assert refusals[0].getMessage() == "refused a connection from 127.0.0.2: it holds 32 already"


def test_past_limit_concurrency_the_refusal_is_json_with_retry_after():
    """80 stalled sockets from 80 addresses fill limit_concurrency=64: a newcomer gets a 503
    it can parse, with Retry-After; once the header deadline closes the stalled sockets
    (each with a JSON 408), the newcomer is served."""
    settings = ServeConfig(limit_concurrency=64, header_timeout_s=2)
    app = create_app(_Upper(), settings)
    with ServerThread(app) as running, _stalled(running.port, 80, spread=True) as socks:
        with httpx.Client(base_url=running.url, timeout=10) as c:
            r = c.get("/health")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json() == {"error": "Server busy: too many open connections; retry later"}
            assert r.headers["connection"] == "close"
        status, headers, body = _json_body(_answer(socks[0], timeout=10))
        assert status == 408 and headers["content-type"] == "application/json"
        assert body == {
            "error": "Request timed out: its headers did not arrive within 2 s (header_timeout_s)"
        }
        time.sleep(0.5)
        with httpx.Client(base_url=running.url, timeout=10) as c:
            assert c.post("/translate", json=ASK).json() == {"translatedText": "FINE"}


def test_one_address_holds_at_most_max_connections_per_client():
    settings = ServeConfig(max_connections_per_client=4, header_timeout_s=30)
    app = create_app(_Upper(), settings)
    with ServerThread(app) as running, _stalled(running.port, 4, spread=False):
        over = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=running.url, timeout=10, transport=over) as c:
            r = c.post("/translate", json=ASK)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json() == {
            "error": "Too many open connections from your address "
            "(max_connections_per_client=4); close some and retry"
        }
        with httpx.Client(base_url=running.url, timeout=10) as c:  # another address
            assert c.post("/translate", json=ASK).status_code == 200


def test_a_trusted_proxy_is_exempt_from_the_per_address_cap():
    settings = ServeConfig(
        max_connections_per_client=2,
        header_timeout_s=30,
        access={"forwarded_allow_ips": "127.0.0.2"},
    )
    app = create_app(_Upper(), settings)
    with ServerThread(app) as running, _stalled(running.port, 4, spread=False):
        proxy = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=running.url, timeout=10, transport=proxy) as c:
            assert c.post("/translate", json=ASK).status_code == 200


def test_a_body_that_stalls_gets_a_json_408_at_the_body_deadline():
    """The 408 comes at the body deadline (1 s after the stall): not before it, and not at
    the header deadline (30 s), the one other deadline that could close the socket; the
    bounds are the two deadlines, not a guess at this machine's speed."""
    settings = ServeConfig(body_timeout_s=1, header_timeout_s=30)
    app = create_app(_Upper(), settings)
    head = HALF + b"Content-Length: 100\r\n\r\n" + b'{"q": "sta'  # 10 of 100 bytes
    with ServerThread(app) as running:
        stalled_at = time.monotonic()  # before the socket sends its 10 bytes
        with _stalled(running.port, 1, spread=False, data=head) as s:
            status, _, body = _json_body(_answer(s[0], timeout=settings.header_timeout_s))
            waited = time.monotonic() - stalled_at
        assert status == 408
        assert settings.body_timeout_s * 0.8 <= waited < settings.header_timeout_s / 2, waited
        assert body == {
            "error": "Request timed out: its body did not arrive within 1 s (body_timeout_s)"
        }
        with httpx.Client(base_url=running.url, timeout=10) as c:  # the server lives on
            assert c.post("/translate", json=ASK).json() == {"translatedText": "FINE"}


def test_an_idle_kept_alive_connection_gets_the_header_deadline_again():
    """After one answer, a second request on the same connection that stalls mid-headers
    is closed at the header deadline too."""
    settings = ServeConfig(header_timeout_s=1)
    app = create_app(_Upper(), settings)
    with ServerThread(app) as running:
        sock = socket.create_connection(("127.0.0.1", running.port))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and stalls
        status, _, body = _json_body(_answer(sock, timeout=10))
        sock.close()
    assert status == 408 and "header_timeout_s" in body["error"]


def test_a_malformed_request_gets_a_json_400():
    app = create_app(_Upper(), ServeConfig())
    with ServerThread(app) as running:
        sock = socket.create_connection(("127.0.0.1", running.port))
        sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        status, headers, body = _json_body(_answer(sock, timeout=10))
        sock.close()
    assert status == 400 and headers["content-type"] == "application/json"
    assert body == {"error": "Invalid HTTP request received."}
