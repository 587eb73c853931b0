"""The server's HTTP protocol: uvicorn's h11 protocol with deadlines for slow clients, a cap on
connections per address, and every refusal as JSON.

uvicorn (0.29 to at least 0.55, ``uvicorn/protocols/http/h11_impl.py``) counts a connection
from the moment it opens, never times out a request whose headers or body stall, and answers
``limit_concurrency`` with a plain-text 503 without ``Retry-After``
(``flow_control.service_unavailable``), so a few hundred idle sockets lock every other client
out. uvicorn takes a protocol class as ``Config(http=...)`` (``Config.load``: a class is used
as it is), and `GuardedH11Protocol` is that class:

- **Header deadline** (``header_timeout_s``): a request's headers must arrive within it,
  counted from the request's first byte (a new connection: from its opening; a request
  pipelined behind another: from when its turn comes); else 408 ``{"error": ...}`` and the
  connection is closed. A connection that sent nothing is closed without an answer (nothing
  to answer; uvicorn's keep-alive timeout does the same).
- **Body deadline** (``body_timeout_s``): the body must arrive within it once the headers are
  in (a pipelined request: once its turn comes); else 408 and the connection is closed, and
  the route sees a disconnect. Each deadline is its own: 0 turns that one off, not the other.
  uvicorn holds a pipelined request back until the answer before it is complete
  (``h11.PAUSED``), then parses it in ``on_response_complete`` -> ``start_next_cycle`` ->
  ``handle_events``, never passing through ``data_received``, and that Request event cancels
  its keep-alive timer: so the deadlines are set after every ``handle_events``, from the
  connection's state, not on the bytes that arrive.
- **Write deadline** (``write_timeout_s``): when an answer fills the transport's buffer past
  its high-water mark (``pause_writing``), the client has that long to take enough of it to
  bring it under the low-water mark (``resume_writing``); else the connection is aborted
  (``transport.abort()``: ``close()`` would wait for the buffer to drain), which frees its
  slot and its buffer.
- **Connections**: at most ``limit_concurrency`` admitted connections (uvicorn's own check
  is switched off); past it a connection gets 503 JSON with ``Retry-After``. At most
  ``max_connections_per_client`` admitted connections per client address (the trusted
  proxies of ``access.forwarded_allow_ips`` are exempt: all their clients share them); past it
  429 JSON with ``Retry-After``. A refused connection is answered as it opens, without
  waiting for its request, its write side is closed at once (the client reads EOF) and the
  socket after `REFUSAL_LINGER_S`; it never counts against anyone. The counts are counters
  kept on each open and close (`OpenConnections`), so an accept never scans the others.
- uvicorn's plain-text 400 for a malformed request is JSON too.

Everything here is checked against a real uvicorn on loopback
(``tests/integration/serve/test_serve_slow_clients.py``, ``test_serve_pipelining.py``), so a uvicorn release that changes these
internals fails those tests instead of silently dropping a guard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from litmt.deploy.server.access import identity
from litmt.deploy.server.config import ServeConfig

log = logging.getLogger(__name__)
WARN_EVERY_S = 10.0  # refusals are logged at most this often (a flood must not flood the log)
_warned: dict[str, tuple[float, int]] = {}  # reason -> (when last logged, refusals since)
REFUSAL_LINGER_S = 1.0  # a refused connection: how long what its client still sends is read


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


@dataclass
class OpenConnections:
    """One server's admitted connections: their count and the count per client address, kept
    up to date on each open and close, so an accept costs O(1) (no scan of the others)."""

    admitted: int = 0
    per_host: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # connections refused since the server started

    def admit(self, host: str | None) -> None:
        self.admitted += 1
        if host is not None:
            self.per_host[host] = self.per_host.get(host, 0) + 1

    def release(self, host: str | None) -> None:
        self.admitted -= 1
        if host is not None:
            left = self.per_host.get(host, 0) - 1
            if left > 0:
                self.per_host[host] = left
            else:
                self.per_host.pop(host, None)


# uvicorn's ServerState (one per server) -> its admitted connections
_open: weakref.WeakKeyDictionary[Any, OpenConnections] = weakref.WeakKeyDictionary()


def open_connections(server_state: Any) -> OpenConnections:
    """The admitted connections of the server whose uvicorn ``ServerState`` is `server_state`."""
    counts = _open.get(server_state)
    if counts is None:
        counts = _open[server_state] = OpenConnections()
    return counts


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with litmt's guards (see the module docstring); `settings` is
    set on the subclass `protocol_class` makes."""

    settings: ServeConfig = ServeConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # uvicorn's check answers in plain text; ours in JSON
        self.admitted = False  # counts against limit_concurrency and the per-address cap
        self.refused = False  # answered at once; what it sends is read and dropped
        self._detached = False  # handed over to a WebSocket protocol: no more guards
        self._host: str | None = None
        self._key: str | None = None  # the per-client count's key (`access.identity`)
        # the read deadline that runs: "headers" or "body" (or None), and the cycle it is for
        # (headers: the cycle before the request being read); kept while a deadline is off
        # (0), so that the next phase still starts its own
        self._phase: str | None = None
        self._phase_cycle: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: Any = None  # the newest cycle the deadlines have seen
        self._got_bytes = False  # the next request has sent something

    # -- connections -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._host = self.client[0] if self.client else None
        # counted as the rate limits count a client: an IPv6 address by its /64
        self._key = identity(self._host) if self._host is not None else None
        counts = open_connections(self.server_state)
        refusal = self._refusal(counts, self._host)
        if refusal is None:
            self.admitted = True
            counts.admit(self._key)
            self._sync()  # the header deadline, from the opening
        else:
            counts.refused += 1
            self._refuse(refusal)

    def _refusal(self, counts: OpenConnections, host: str | None) -> bytes | None:
        """The answer that refuses this connection, or None to admit it (O(1): counters)."""
        s = self.settings
        headers = {"retry-after": str(s.retry_after_s)}
        if s.limit_concurrency and counts.admitted >= s.limit_concurrency:
            _warn("busy", "refused a connection: %d are open (limit_concurrency)", counts.admitted)
            return json_response(
                503,
                "Service Unavailable",
                "Server busy: too many open connections; retry later",
                headers,
            )
        cap = s.max_connections_per_client
        if cap and host is not None and host not in s.access.proxies:
            mine = counts.per_host.get(identity(host), 0)
            if mine >= cap:
                _warn("per-client", "refused a connection from %s: it holds %d already", host, mine)
                return json_response(
                    429,
                    "Too Many Requests",
                    f"Too many open connections from your address "
                    f"(max_connections_per_client={cap}); close some and retry",
                    headers,
                )
        return None

    def _refuse(self, answer: bytes) -> None:
        """Answer at once, without waiting for a request, and end the connection: the write
        side closes now (the client reads the answer, then EOF); what the client still sends
        is read and dropped for `REFUSAL_LINGER_S` (closing on unread bytes would reset the
        connection, and the client could lose the answer), then the socket is closed."""
        self.refused = True
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._cancel_write_timer()
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self.admitted:
            self.admitted = False
            open_connections(self.server_state).release(self._key)

    def handle_websocket_upgrade(self, event: Any) -> None:
        # the connection leaves this protocol (uvicorn's WebSocket one takes the transport
        # and never calls our connection_lost): it stops counting here, and no timer of ours
        # may touch it
        self._detached = True
        self._disarm()
        self._cancel_write_timer()
        self._release()
        super().handle_websocket_upgrade(event)

    # -- read deadlines ----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.refused or self._detached:
            return  # its answer is sent; the request is not read
        if self._between_requests():
            self._got_bytes = True  # the next request's first bytes: its header deadline
            self._sync()
        super().data_received(data)

    def handle_events(self) -> None:
        # Runs on data_received and, for a pipelined request that h11 held back, on
        # on_response_complete -> start_next_cycle: both get their deadlines here.
        super().handle_events()
        self._sync()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _sync(self) -> None:
        """Set the read deadline the connection's state calls for: a request whose headers are
        in and whose body is not gets the body deadline; between requests, a connection that
        is new or has sent (or buffered, pipelined) part of the next request gets the header
        deadline. Each request's phase gets its own deadline, counted from when it began."""
        if self._detached or self.refused or self.transport.is_closing():
            self._disarm()
            return
        cycle = self.cycle
        if cycle is not self._seen_cycle:  # a new request's headers are in
            self._seen_cycle, self._got_bytes = cycle, False
        if cycle is not None and not cycle.response_complete:
            phase = "body" if cycle.more_body and not cycle.disconnected else None
        elif cycle is None or self._got_bytes or self._buffered():
            phase = "headers"
        else:
            phase = None  # idle between requests: uvicorn's keep-alive timeout
        if phase is None:
            self._disarm()
        elif (phase, cycle) != (self._phase, self._phase_cycle):
            self._arm(phase, cycle)

    def _buffered(self) -> bool:
        """h11 holds bytes of a next request (pipelined behind the one just answered)."""
        return bool(self.conn.trailing_data[0])

    def _arm(self, phase: str, cycle: Any) -> None:
        self._disarm()
        self._phase, self._phase_cycle = phase, cycle
        limit = (
            self.settings.header_timeout_s if phase == "headers" else self.settings.body_timeout_s
        )
        if limit > 0:  # off: no timer, but the phase is known, so the next one still arms
            self._timer = self.loop.call_later(limit, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase, self._phase_cycle = None, None, None

    def _expired(self) -> None:
        """A deadline passed: answer 408 (unless nothing was sent) and close."""
        phase = self._phase
        self._timer, self._phase, self._phase_cycle = None, None, None
        if self.transport.is_closing():
            return
        cycle = self.cycle if phase == "body" else None
        if phase == "body" or self._got_bytes or self._buffered():
            key = "header_timeout_s" if phase == "headers" else "body_timeout_s"
            limit = getattr(self.settings, key)
            message = f"Request timed out: its {phase} did not arrive within {limit:g} s ({key})"
            _warn(key, "%s from %s", message, self._host or "?")
            if cycle is None or not cycle.response_started:
                self.transport.write(json_response(408, "Request Timeout", message, {}))
        if cycle is not None:  # the route sees a disconnect; nothing more is written
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # -- write deadline ----------------------------------------------------------------
    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark: the client has that long
        (``write_timeout_s``) to take enough of it to bring it back under the low-water mark."""
        super().pause_writing()
        limit = self.settings.write_timeout_s
        if limit > 0 and self._write_timer is None and not self._detached:
            self._write_timer = self.loop.call_later(limit, self._write_expired)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        """The client took too little of its answer in time: abort (``close`` would wait for
        the buffer to drain, i.e. forever); the slot and the buffer are freed at once."""
        self._write_timer = None
        _warn(
            "write_timeout_s",
            "aborted a connection from %s: its answer was not taken within %g s "
            "(write_timeout_s; %d bytes unsent)",
            self._host or "?",
            self.settings.write_timeout_s,
            self.transport.get_write_buffer_size(),
        )
        self.transport.abort()  # connection_lost: the route sees a disconnect

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


__all__ = [
    "GuardedH11Protocol",
    "OpenConnections",
    "json_response",
    "open_connections",
    "protocol_class",
    "uvicorn_options",
]
