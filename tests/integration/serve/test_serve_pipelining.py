"""Pipelined requests against a real uvicorn on loopback (litmt's HTTP protocol,
`litmt.deploy.server.protocol`): a request sent behind another in the same write meets the
header and body deadlines like any other.

uvicorn holds such a request back (h11 PAUSED) until the answer before it is complete, then
parses it from ``on_response_complete`` without passing through ``data_received``; before, it
ran with no deadline at all (its Request event even cancels uvicorn's keep-alive timer).
Distinct users are distinct loopback addresses (127.0.0.x)."""

from __future__ import annotations

import socket
import time

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY_NEVER_COMES = HEALTH + POST + b"Content-Length: 10\r\n\r\n"  # headers whole, no body


class _Upper:
    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        return [t.upper() for t in texts]


def _read_until_closed(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the server wrote to `sock`, and whether it closed it before `deadline`."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return b"".join(chunks), True
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


def test_64_pipelined_requests_whose_body_never_comes_are_closed_and_a_newcomer_is_served():
    """The issue's pipelining probe: limit_concurrency=64; 64 sockets from 4 addresses (16
    each, under the per-address cap) each send a whole GET /health and the headers of a POST
    /translate whose 10-byte body never comes. Before: none was ever closed, and a newcomer
    got 503. Now the POST gets its body deadline when its turn comes: 408, closed."""
    settings = ServeConfig(limit_concurrency=64, header_timeout_s=1, body_timeout_s=2)
    assert settings.max_connections_per_client > 16
    app = create_app(_Upper(), settings)
    socks: list[socket.socket] = []
    with ServerThread(app) as running:
        try:
            for i in range(64):
                host = f"127.0.0.{2 + i // 16}"
                sock = socket.create_connection(
                    ("127.0.0.1", running.port), timeout=5, source_address=(host, 0)
                )
                sock.sendall(BODY_NEVER_COMES)
                socks.append(sock)
            sent_at = time.monotonic()
            deadline = sent_at + settings.body_timeout_s + 3  # the deadline and some slack
            answers = [_read_until_closed(sock, deadline) for sock in socks]
            open_ = sum(1 for _, closed in answers if not closed)
            assert open_ == 0, f"{open_} of 64 still open {time.monotonic() - sent_at:.1f} s on"
            for raw, _ in answers:
                assert raw.startswith(b"HTTP/1.1 200"), raw[:100]  # /health
                assert b"HTTP/1.1 408" in raw and b"(body_timeout_s)" in raw, raw[-300:]
        finally:
            for sock in socks:
                sock.close()
        newcomer = httpx.HTTPTransport(local_address="127.0.0.6")
        with httpx.Client(base_url=running.url, timeout=10, transport=newcomer) as c:
            assert c.get("/health").status_code == 200


def test_a_pipelined_request_whose_headers_stall_gets_the_header_deadline():
    """Three requests in one write: two whole (answered, the deadlines do not cut them) and
    one cut mid-headers, which gets its own header deadline (1 s) when its turn comes: a
    JSON 408 well before uvicorn's keep-alive timeout (5 s), which before closed it without
    an answer."""
    settings = ServeConfig(header_timeout_s=1, body_timeout_s=30)
    app = create_app(_Upper(), settings)
    body = b'{"q": "fine", "source": "en", "target": "de"}'
    translate = POST + b"Content-Length: %d\r\n\r\n" % len(body) + body
    with ServerThread(app, timeout_keep_alive=5) as running:
        sock = socket.create_connection(("127.0.0.1", running.port), timeout=5)
        try:
            sock.sendall(HEALTH + translate + POST)
            sent_at = time.monotonic()
            raw, closed = _read_until_closed(sock, sent_at + 4)
        finally:
            sock.close()
    assert closed and raw.startswith(b"HTTP/1.1 200")
    assert raw.count(b"HTTP/1.1 200") == 2 and b'"FINE"' in raw
    assert b"HTTP/1.1 408" in raw and b"(header_timeout_s)" in raw, raw[-300:]
