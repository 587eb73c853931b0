"""A light HTTP/1.1 load client for `benchmarks.benchmark_server`: asyncio streams, one
kept-alive connection per client, each client on its own loopback address.

A thread per client (httpx) costs the 2 shared cores more than the server does at a few
hundred clients, so the client would measure itself; here a request costs one write and two
reads on the event loop. A client that gets a 503 or 429 waits its ``Retry-After`` (at most
5 s) before its next request, as a polite client does, so an overloaded server is measured
on the work it chooses to take.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


def client_address(i: int, host: str) -> str | None:
    """Client `i`'s source address: 127.0.x.y on loopback (distinct users), else None."""
    if not ipaddress.ip_address(host).is_loopback:
        return None
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


class Connection:
    """One client's kept-alive connection to `url`."""

    def __init__(self, url: str, source: str | None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.source = source
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        local = (self.source, 0) if self.source else None
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, local_addr=local
        )

    def _bytes(self, method: str, path: str, body: bytes) -> bytes:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict, bytes]:
        """(status, headers, body); raises OSError / IncompleteReadError on a broken link."""
        if self.writer is None:
            await self._open()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(self._bytes(method, path, body))
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
            data = await self.reader.readexactly(int(headers.get("content-length", 0)))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise
        if headers.get("connection") == "close":
            self.close()
        return status, headers, data

    async def hang_up(self, method: str, path: str, body: bytes) -> None:
        """Send a request on a fresh connection and close it without reading the answer."""
        local = (self.source, 0) if self.source else None
        _, writer = await asyncio.open_connection(self.host, self.port, local_addr=local)
        writer.write(self._bytes(method, path, body))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Tally:
    """Answers by kind and status, and the latencies of the 200s (seconds)."""

    status: dict[str, dict[str, int]] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def add(self, kind: str, code: str, took: float | None = None) -> None:
        by_kind = self.status.setdefault(kind, {})
        by_kind[code] = by_kind.get(code, 0) + 1
        if code == "200" and took is not None:
            self.latencies.append(took)

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for codes in self.status.values():
            for code, k in codes.items():
                out[code] = out.get(code, 0) + k
        return dict(sorted(out.items()))


# A request: (kind, method, path, body); "hangup" requests are sent and abandoned.
Request = tuple[str, str, str, bytes]


def plain_requests(sentences: list[str], src: str, tgt: str) -> Callable[[int], Request]:
    """Request `i`: one sentence to translate."""

    def make(i: int) -> Request:
        body = {"q": sentences[i % len(sentences)], "source": src, "target": tgt}
        return "plain", "POST", "/translate", json.dumps(body).encode()

    return make


def mixed_requests(
    sentences: list[str], prefixes: list[str], src: str, tgt: str, seed: int = 0
) -> Callable[[int], Request]:
    """Request `i` of a mixed load: plain 50 %, alternatives=3 20 %, prefix 10 %, /attention
    5 %, bad input 10 % (``alternatives: 1e999``), a client that hangs up 5 %, in one
    shuffled order of 20 that repeats."""
    kinds = ["plain"] * 10 + ["alternatives"] * 4 + ["prefix"] * 2 + ["attention"]
    kinds += ["bad"] * 2 + ["hangup"]
    random.Random(seed).shuffle(kinds)  # one fixed order, cycled: every 20 requests hold all

    def make(i: int) -> Request:
        kind, s = kinds[i % len(kinds)], sentences[i % len(sentences)]
        base = {"q": s, "source": src, "target": tgt}
        if kind == "alternatives":
            base["alternatives"] = 3
        elif kind == "prefix":
            base["prefix"] = prefixes[i % len(prefixes)]
        elif kind == "attention":
            return kind, "POST", "/attention", json.dumps({"q": s}).encode()
        elif kind == "bad":  # an overflowing number: a JSON 400 before any decoding
            return (
                kind,
                "POST",
                "/translate",
                json.dumps(base).encode()[:-1] + b', "alternatives": 1e999}',
            )
        return kind, "POST", "/translate", json.dumps(base).encode()

    return make


async def run_clients(
    url: str, make: Callable[[int], Request], concurrency: int, n: int, bound: float
) -> tuple[Tally, float]:
    """`concurrency` clients, each one request in flight, until `n` requests or `bound` s;
    (the tally, wall seconds). A broken connection counts as ``"conn"``."""
    tally, counter = Tally(), iter(range(n))
    stop_at = time.monotonic() + bound
    host = urlsplit(url).hostname or "127.0.0.1"

    async def client(c: int) -> None:
        conn = Connection(url, client_address(c, host))
        try:
            while time.monotonic() < stop_at:
                i = next(counter, None)
                if i is None:
                    return
                kind, method, path, body = make(i)
                if kind == "hangup":
                    await conn.hang_up(method, path, body)
                    tally.add(kind, "hung up")
                    continue
                start = time.perf_counter()
                try:
                    status, headers, _ = await conn.request(method, path, body)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    tally.add(kind, "conn")
                    continue
                tally.add(kind, str(status), time.perf_counter() - start)
                if status in (429, 503) and "retry-after" in headers:
                    await asyncio.sleep(min(5.0, float(headers["retry-after"])))
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return tally, time.perf_counter() - start


def summary(tally: Tally, wall: float, concurrency: int) -> dict[str, Any]:
    """A level's row: 200s per second and their latency percentiles (ms)."""
    import statistics

    lat = sorted(tally.latencies)
    cuts = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    totals = tally.totals()
    return {
        "concurrency": concurrency,
        "requests": len(lat),
        "errors": sum(k for code, k in totals.items() if code != "200"),
        "status": totals,
        "by_kind": tally.status,
        "seconds": wall,
        "requests_per_s": len(lat) / wall if wall else 0.0,
        "p50_ms": 1000 * cuts[49] if cuts else 0.0,
        "p95_ms": 1000 * cuts[94] if cuts else 0.0,
        "p99_ms": 1000 * cuts[98] if cuts else 0.0,
    }


__all__ = ["Connection", "Tally", "mixed_requests", "plain_requests", "run_clients", "summary"]
