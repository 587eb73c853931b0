"""The server's HTTP protocol: uvicorn's h11 protocol with deadlines for slow clients, a cap on
connections per address, and every refusal as JSON.

uvicorn (0.29 to at least 0.55, ``uvicorn/protocols/http/h11_impl.py``) counts a connection
from the moment it opens, never times out a request whose headers or body stall, and answers
``limit_concurrency`` with a plain-text 503 without ``Retry-After``
(``flow_control.service_unavailable``), so a few hundred idle sockets lock every other client
out. uvicorn takes a protocol class as ``Config(http=...)`` (``Config.load``: a class is used
as it is), and `GuardedH11Protocol` is that class:

- **Header deadline** (``header_timeout_s``): a request's headers must arrive within it,
  counted from the request's first byte (a new connection: from its opening); else 408
  ``{"error": ...}`` and the connection is closed. A connection that sent nothing is closed
  without an answer (nothing to answer; uvicorn's keep-alive timeout does the same).
- **Body deadline** (``body_timeout_s``): the body must arrive within it once the headers are
  in; else 408 and the connection is closed, and the route sees a disconnect.
- **Connections**: at most ``limit_concurrency`` admitted connections (uvicorn's own check
  is switched off); past it a connection's request gets 503 JSON with ``Retry-After``. At
  most ``max_connections_per_client`` admitted connections per client address (the trusted
  proxies of ``access.forwarded_allow_ips`` are exempt: all their clients share them); past it
  429 JSON with ``Retry-After``. A refused connection is closed after its answer and never
  counts against anyone, and the deadlines close one that stalls.
- uvicorn's plain-text 400 for a malformed request is JSON too.

Everything here is checked against a real uvicorn on loopback
(``tests/integration/serve/test_serve_slow_clients.py``), so a uvicorn release that changes these
internals fails those tests instead of silently dropping a guard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from litmt.deploy.server.config import ServeConfig

log = logging.getLogger(__name__)
WARN_EVERY_S = 10.0  # refusals are logged at most this often (a flood must not flood the log)
_warned: dict[str, tuple[float, int]] = {}  # reason -> (when last logged, refusals since)


def _warn(reason: str, message: str, *args: Any) -> None:
    """Log a refusal once per `WARN_EVERY_S` per reason, with the count of those unlogged."""
    now = time.monotonic()
    last, unlogged = _warned.get(reason, (-WARN_EVERY_S, 0))
    if now - last < WARN_EVERY_S:
        _warned[reason] = (last, unlogged + 1)
        return
    _warned[reason] = (now, 0)
    more = f" ({unlogged} more since the last such line)" if unlogged else ""
    log.warning(message + more, *args)


def json_response(status: int, reason: str, message: str, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 response with ``{"error": message}`` that closes the connection."""
    body = json.dumps({"error": message}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"content-length: {len(body)}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def refusal_app(status: int, message: str, retry_after_s: int) -> Any:
    """An ASGI app that answers every request with `status` and ``{"error": message}``,
    ``Retry-After`` and ``Connection: close``."""
    body = json.dumps({"error": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after_s).encode()),
        (b"connection", b"close"),
    ]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with litmt's guards (see the module docstring); `settings` is
    set on the subclass `protocol_class` makes."""

    settings: ServeConfig = ServeConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # uvicorn's check answers in plain text; ours in JSON
        self.admitted = False  # counts against limit_concurrency and the per-address cap
        self._phase: str | None = None  # "headers" or "body": the deadline that runs
        self._timer: asyncio.TimerHandle | None = None
        self._cycle_before: Any = None  # the cycle before the request being read
        self._got_bytes = False  # the request being read has sent something

    # -- connections -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        refusal = self._refusal(self.client[0] if self.client else None)
        if refusal is None:
            self.admitted = True
        else:
            self.app = refusal  # answered in JSON when its request comes, then closed
        self._arm("headers")

    def _refusal(self, host: str | None) -> Any | None:
        """The app that refuses this connection, or None to admit it."""
        s = self.settings
        admitted = [p for p in self.connections if p is not self and getattr(p, "admitted", 0)]
        if s.limit_concurrency and len(admitted) >= s.limit_concurrency:
            _warn("busy", "refused a connection: %d are open (limit_concurrency)", len(admitted))
            return refusal_app(
                503,
                "Server busy: too many open connections; retry later",
                s.retry_after_s,
            )
        cap = s.max_connections_per_client
        if cap and host is not None and host not in s.access.proxies:
            mine = sum(1 for p in admitted if p.client and p.client[0] == host)
            if mine >= cap:
                _warn("per-client", "refused a connection from %s: it holds %d already", host, mine)
                return refusal_app(
                    429,
                    f"Too many open connections from your address "
                    f"(max_connections_per_client={cap}); close some and retry",
                    s.retry_after_s,
                )
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- deadlines ---------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._phase is None and (self.cycle is None or self.cycle.response_complete):
            self._arm("headers")  # the next request on a kept-alive connection
        if self._phase == "headers":
            self._got_bytes = True
        super().data_received(data)
        self._advance()

    def _advance(self) -> None:
        """Move the deadline on: headers in → the body's; body in → none."""
        cycle = self.cycle
        if self._phase == "headers" and cycle is not None and cycle is not self._cycle_before:
            self._disarm()
            if cycle.more_body and not cycle.response_complete:
                self._arm("body")
        if self._phase == "body" and (cycle is None or not cycle.more_body):
            self._disarm()

    def _arm(self, phase: str) -> None:
        self._disarm()
        limit = (
            self.settings.header_timeout_s if phase == "headers" else self.settings.body_timeout_s
        )
        if limit <= 0:
            return
        self._phase, self._cycle_before = phase, self.cycle
        if phase == "headers":
            self._got_bytes = False
        self._timer = self.loop.call_later(limit, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expired(self) -> None:
        """A deadline passed: answer 408 (unless nothing was sent) and close."""
        phase = self._phase
        self._timer, self._phase = None, None
        if self.transport.is_closing():
            return
        cycle = self.cycle if phase == "body" else None
        if phase == "body" or self._got_bytes:
            key = "header_timeout_s" if phase == "headers" else "body_timeout_s"
            limit = getattr(self.settings, key)
            message = f"Request timed out: its {phase} did not arrive within {limit:g} s ({key})"
            _warn(key, "%s from %s", message, self.client[0] if self.client else "?")
            if cycle is None or not cycle.response_started:
                self.transport.write(json_response(408, "Request Timeout", message, {}))
        if cycle is not None:  # the route sees a disconnect; nothing more is written
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # -- uvicorn's own answers, as JSON ------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self.transport.write(json_response(400, "Bad Request", msg, {}))
        self.transport.close()


def protocol_class(settings: ServeConfig) -> type[GuardedH11Protocol]:
    """`GuardedH11Protocol` bound to `settings` (uvicorn makes one instance per connection)."""
    return type("LitmtH11Protocol", (GuardedH11Protocol,), {"settings": settings})


def uvicorn_options(settings: ServeConfig) -> dict[str, Any]:
    """`uvicorn.Config` keywords of a litmt server (`litmt.cli.serve`, the test servers)."""
    return {
        "http": protocol_class(settings),
        "limit_concurrency": None,  # the protocol's, in JSON
        "timeout_graceful_shutdown": settings.timeout_graceful_shutdown,  # SIGTERM: drain
        # the client address is access.forwarded_allow_ips's alone: uvicorn's own proxy
        # headers (on for 127.0.0.1 by default) would rewrite it before the rate limit
        "proxy_headers": False,
    }


__all__ = ["GuardedH11Protocol", "json_response", "protocol_class", "uvicorn_options"]
