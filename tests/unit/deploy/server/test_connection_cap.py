"""The per-client connection cap counts a client as the rate limits do (`access.identity`): an
IPv6 address by its /64, so one subscriber's many addresses are one client (issue 55)."""

from __future__ import annotations

from types import SimpleNamespace

from litmt.deploy.server.access import identity
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.protocol import GuardedH11Protocol, OpenConnections


def _refusal(settings: ServeConfig, counts: OpenConnections, host: str) -> bytes | None:
    return GuardedH11Protocol._refusal(SimpleNamespace(settings=settings), counts, host)


def test_ipv6_clients_are_capped_by_their_64():
    settings = ServeConfig(max_connections_per_client=2)
    counts = OpenConnections()
    for host in ("2001:db8::1", "2001:db8::2"):  # one /64, two addresses
        assert _refusal(settings, counts, host) is None
        counts.admit(identity(host))
    refused = _refusal(settings, counts, "2001:db8::ffff")  # a third address of that /64
    assert refused is not None and refused.startswith(b"HTTP/1.1 429 ")
    assert b"max_connections_per_client=2" in refused
    assert _refusal(settings, counts, "2001:db8:0:1::1") is None  # the next /64: another client
    counts.release(identity("2001:db8::1"))
    assert _refusal(settings, counts, "2001:db8::ffff") is None  # a slot of the /64 freed


def test_ipv4_clients_are_counted_per_address():
    settings = ServeConfig(max_connections_per_client=1)
    counts = OpenConnections()
    counts.admit(identity("192.0.2.1"))
    assert _refusal(settings, counts, "192.0.2.1") is not None
    assert _refusal(settings, counts, "192.0.2.2") is None
    assert _refusal(settings, counts, "::ffff:192.0.2.1") is not None  # IPv4-mapped: the same
