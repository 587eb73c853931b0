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


def test_turning_one_deadline_off_leaves_the_other_on():
    """header_timeout_s: 0 used to turn the body deadline off too (the body's was armed only
    on leaving a running header deadline): a stalled body was never closed."""
    head = HALF + b"Content-Length: 100\r\n\r\n" + b'{"q": "sta'  # 10 of 100 bytes
    app = create_app(_Upper(), ServeConfig(header_timeout_s=0, body_timeout_s=1))
    with ServerThread(app) as running, _stalled(running.port, 1, spread=False, data=head) as s:
        status, _, body = _json_body(_answer(s[0], timeout=5))
    assert status == 408 and "body_timeout_s" in body["error"]
    app = create_app(_Upper(), ServeConfig(header_timeout_s=1, body_timeout_s=0))
    with ServerThread(app) as running, _stalled(running.port, 1, spread=False) as s:
        status, _, body = _json_body(_answer(s[0], timeout=5))
    assert status == 408 and "header_timeout_s" in body["error"]


class _Huge(_Upper):
    """Answers "big" with 16 MB of text: more than loopback's socket buffers hold, so a client
    that never reads leaves most of it in the server's write buffer."""

    def translate(self, texts: list[str], **options) -> list[str]:
        return ["x" * 16_000_000 if t == "big" else t.upper() for t in texts]


def test_an_answer_the_client_does_not_take_is_aborted_at_the_write_deadline():
    """The issue's write probe (Why 3): a client asks for a large answer and never reads it.
    Before, the keep-alive timer's transport.close() waited for the buffer to drain, i.e.
    forever: the connection kept its slot (limit_concurrency=1: every newcomer got 503)."""
    settings = ServeConfig(limit_concurrency=1, write_timeout_s=1)
    app = create_app(_Huge(), settings)
    body = json.dumps({"q": "big", "source": "en", "target": "de"}).encode()
    request = HALF + b"Content-Length: %d\r\n\r\n" % len(body) + body
    with ServerThread(app) as running:
        connections = running.server.server_state.connections
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it never reads anyway
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", running.port))
            sock.sendall(request)
            sent_at = time.monotonic()
            deadline = sent_at + 5
            while not connections and time.monotonic() < deadline:  # the server accepts it
                time.sleep(0.01)
            assert connections
            deadline = sent_at + settings.write_timeout_s + 5  # + the answer's making
            while connections and time.monotonic() < deadline:
                time.sleep(0.05)
            waited = time.monotonic() - sent_at
            assert not connections, f"the connection still holds its slot after {waited:.1f} s"
            assert waited >= settings.write_timeout_s * 0.8, waited
            with httpx.Client(base_url=running.url, timeout=10) as c:  # the slot is free
                assert c.get("/health").status_code == 200
        finally:
            sock.close()


def test_a_refused_connection_is_answered_and_closed_at_once():
    """Why 7: a refused connection waited for a request that might never come and stayed
    open until the header deadline (30 s here). Now the answer comes as it opens, then EOF,
    whether it sends anything or not; the admitted ones are counted, not scanned."""

    def refused(port: int, host: str) -> int:
        """The status a connection from `host` that sends nothing reads, within 2 s."""
        sock = socket.create_connection(("127.0.0.1", port), source_address=(host, 0))
        opened = time.monotonic()
        try:
            status, headers, body = _json_body(_answer(sock, timeout=5))
        finally:
            sock.close()
        assert time.monotonic() - opened < 2
        assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        assert set(body) == {"error"}
        return status

    settings = ServeConfig(limit_concurrency=3, max_connections_per_client=2, header_timeout_s=30)
    app = create_app(_Upper(), settings)
    with ServerThread(app) as running, _stalled(running.port, 2, spread=False):
        assert refused(running.port, "127.0.0.2") == 429  # its address holds 2
        with _stalled(running.port, 1, spread=True):  # 127.0.10.1: the server is full
            assert refused(running.port, "127.0.0.4") == 503
            from litmt.deploy.server.protocol import open_connections

            counts = open_connections(running.server.server_state)
            assert (counts.admitted, counts.per_host) == (3, {"127.0.0.2": 2, "127.0.10.1": 1})
            assert counts.refused == 2
        deadline = time.monotonic() + 5
        while counts.admitted > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (counts.admitted, counts.per_host) == (2, {"127.0.0.2": 2})
