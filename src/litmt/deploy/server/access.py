"""Operator controls of the HTTP server: API keys, a rate limit and the CORS policy.

Behaviour and messages follow LibreTranslate (``libretranslate/app.py``, ``access_check``,
``get_req_limits`` and its error handlers; ``api_keys.py``; ``main.py``'s flags):

- Keys are off unless ``api_keys_file`` or the ``api_keys_env`` variable gives some. With
  keys on, a request may carry ``api_key`` (in its JSON, form or multipart body, as
  LibreTranslate reads it). A key that is not known → 403 ``{"error": "Invalid API key"}``.
  A request without one is served at the default limit (``--api-keys``), unless keys are
  required (``require_api_key``, or ``require_api_key_origin`` and an ``Origin`` header that
  the regex does not match in full) → 403 ``{"error": "Please contact the server operator to get an
  API key"}``. (LibreTranslate answers that one with 400; issue 24 asks for 403.) A wrong key
  counts as a hit of its client IP, so guessing keys runs into the 429 below, and against its
  own limit (``wrong_key_limit`` per minute per client), counted even with no ``req_limit``.
- Rate limit (``--req-limit``): requests per minute, counted per API key when one is given
  and per client IP otherwise, in a moving window of 60 s. A key may carry its own limit
  (LibreTranslate's ``req_limit`` column): ``KEY LIMIT`` on its line. Over it → 429
  ``{"error": "Slowdown: N per 1 minute"}`` with ``Retry-After``. ``-1`` = no limit.
- Client IP: the TCP peer's; when the peer is one of ``forwarded_allow_ips`` (uvicorn's and
  gunicorn's setting, same reading: `TrustedProxies`), the last ``X-Forwarded-For`` address
  that is not one of them, every ``X-Forwarded-For`` line joined in order as uvicorn joins
  them. The first addresses are the client's to forge, never read unless every hop is
  trusted. A client is a parsed IP address (anything else: the peer), and an IPv6 client is
  its /64 network (`identity`). ``"*"`` is refused. The deprecated ``trust_forwarded_for:
  true`` trusts the direct peer as the one proxy (the last address).
- CORS: none by default (same origin only: no ``Access-Control-*`` headers); ``"*"`` (or
  ``true``) for every origin as LibreTranslate does; or a list of allowed origins.
- Logs: once a guard exists, ``api_key=...`` (query string, form, JSON or dict text) and every
  known key are written as ``***`` in every log record of the process, uvicorn's access
  line included (`redact_keys_in_logs`).

The counts live in memory, per server process, for at most `MAX_CLIENTS` keys and addresses
(the least recently seen are forgotten first).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

from litmt.config import REMOVED_IN, renamed_attribute
from litmt.deploy.server.log_redaction import forget_keys_in_logs, redact_keys_in_logs
from litmt.errors import ConfigError

INVALID_KEY = "Invalid API key"  # LibreTranslate's message
NEED_KEY = "Please contact the server operator to get an API key"  # LibreTranslate's message
WINDOW_S = 60.0  # req_limit is per minute
ANY_HOST = ("0.0.0.0", "::", "")
MAX_CLIENTS = 10_000  # keys and addresses the limiter remembers; the least recently seen go first
log = logging.getLogger(__name__)


@dataclass
class AccessConfig:
    """API keys and the rate limit: the ``access`` block of ``conf/serve.yaml`` (each field's
    docstring is its one documentation, shown there as the key's comment)."""

    api_keys_file: str | None = None
    """API keys, one per line ("KEY" or "KEY LIMIT": its own requests/minute); null = none. A
    bad api_key gets 403 and counts against its IP's req_limit"""
    api_keys_env: str | None = "LITMT_API_KEYS"
    """environment variable with more keys (comma- or space-separated); '' = none. Keys are on
    when the file or the variable gives any"""
    require_api_key: bool = False
    """true: a request without api_key gets 403; false: it is served at req_limit per IP"""
    require_api_key_origin: str | None = None
    """regex (LibreTranslate's --require-api-key-origin): a request needs a key unless its
    Origin matches it in full"""
    req_limit: int = -1
    """requests per minute per API key (or per client IP without one), else 429 "Slowdown: N
    per 1 minute"; -1 = no limit"""
    wrong_key_limit: int = 10
    """wrong API keys per minute per client IP (an IPv6 client: its /64), counted even when
    req_limit is -1; past it 429 "Slowdown: N per 1 minute"; -1 = no limit"""
    forwarded_allow_ips: str | list[str] | None = None
    """your reverse proxies (uvicorn's and gunicorn's forwarded_allow_ips): IPs or CIDRs, a list
    or comma-separated ("*" is refused: any client could name its own address). X-Forwarded-For
    (every line) is read only from these, and the client is its last address not in them;
    null = none: the client is the peer"""
    trust_forwarded_for: InitVar[bool | None] = None  # deprecated: see `_old_trust_forwarded_for`

    def __post_init__(self, trust_forwarded_for: bool | None) -> None:
        self._trust_peer = self._old_trust_forwarded_for(trust_forwarded_for)
        self.proxies = TrustedProxies(self.forwarded_allow_ips)
        for name in ("req_limit", "wrong_key_limit"):
            value = int(getattr(self, name))
            if value == 0 or value < -1:
                raise ConfigError(f"{name} must be positive or -1 (no limit), got {value}")
        if self.require_api_key_origin:
            try:
                re.compile(self.require_api_key_origin)
            except re.error as exc:
                raise ConfigError(f"require_api_key_origin is not a regex: {exc}") from None

    def _old_trust_forwarded_for(self, value: bool | None) -> bool:
        """The deprecated boolean (until litmt 0.3.0), read the safe way: true = the
        direct peer, whatever its address, is your one reverse proxy, and the client is the
        last X-Forwarded-For address (the one that proxy appended), never the first (which the
        client writes). Not "*", which would trust every address in the header."""
        if value is None:
            return False
        log.warning(
            "serve: access.trust_forwarded_for is deprecated and will be removed in litmt %s; "
            "use access.forwarded_allow_ips (your proxies' addresses). Until then "
            "trust_forwarded_for=%s %s",
            REMOVED_IN,
            str(bool(value)).lower(),
            "trusts the direct peer as one proxy: the client is the last X-Forwarded-For address"
            if value
            else "reads no X-Forwarded-For",
        )
        if value and self.forwarded_allow_ips is not None:
            raise ConfigError(
                "serve: access.trust_forwarded_for is the old form of access.forwarded_allow_ips; "
                "set only forwarded_allow_ips"
            )
        return bool(value)


class TrustedProxies:
    """The reverse proxies of ``forwarded_allow_ips``, as uvicorn's ``ProxyHeadersMiddleware``
    reads them: addresses and networks. ``"*"`` (uvicorn's "trust every peer and every
    forwarded address") is refused: with it any client names its own address, escaping
    ``req_limit``, ``wrong_key_limit`` and ``max_connections_per_client``."""

    def __init__(self, allow: str | list[str] | None) -> None:
        entries = allow.split(",") if isinstance(allow, str) else list(allow or [])
        entries = [str(e).strip() for e in entries if str(e).strip()]
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            if entry == "*":
                raise ConfigError(
                    'forwarded_allow_ips: "*" would let any client name its own address and '
                    "escape the limits; list your proxies (e.g. 127.0.0.1, 10.0.0.0/8)"
                )
            try:  # a bare address is its /32 (or /128) network
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ConfigError(
                    f"forwarded_allow_ips: {entry!r} is not an IP address or network "
                    "(e.g. 127.0.0.1, 10.0.0.0/8)"
                ) from None

    def __contains__(self, host: str | None) -> bool:
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def client(
        self, peer: str, forwarded_for: str | list[str] | None, *, trust_peer: bool = False
    ) -> str:
        """The client's address: `peer` unless it is a proxy (or `trust_peer`) and sent
        X-Forwarded-For; then the last address there that is not a proxy (each proxy appends
        the address it saw), or the first one when all are.

        uvicorn's rule (``uvicorn/middleware/proxy_headers.py``: ``ProxyHeadersMiddleware.
        __call__`` joins every X-Forwarded-For line with ", " in order, and
        ``_TrustedHosts.get_trusted_client_address`` walks the list from the right, skipping
        trusted hosts), with one difference: the address found must parse as an IP address,
        else the client is `peer` (a proxy that forwards junk is counted as itself).

        `forwarded_for`: the header's lines (a string: one line)."""
        lines = [forwarded_for] if isinstance(forwarded_for, str) else list(forwarded_for or [])
        if not lines or not (trust_peer or peer in self):
            return peer
        hosts = [_host(h) for h in ", ".join(lines).split(",")]
        for host in reversed(hosts):
            if host not in self:
                break
        else:  # every hop is a proxy: the client was one too (uvicorn's reading)
            host = hosts[0]
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            return peer


def _host(entry: str) -> str:
    """The address of one X-Forwarded-For entry, without a port (``[::1]:80``, ``1.2.3.4:80``),
    as uvicorn's ``_parse_host_port`` reads it."""
    entry = entry.strip()
    if entry.startswith("[") and "]" in entry:
        return entry[1 : entry.index("]")]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


def identity(host: str) -> str:
    """The key a client is counted under: an IPv4 address itself, an IPv6 address its /64
    network (one subscriber's usual allocation: its addresses are one client), an
    IPv4-mapped IPv6 address its IPv4; anything else (not an IP) as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def parse_keys(text: str, source: str) -> dict[str, int | None]:
    """Keys and their own limits (None: the default) from a file's or a variable's text."""
    keys: dict[str, int | None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) > 2 or (len(fields) == 2 and not fields[1].isdigit()):
            raise ConfigError(f"{source}:{number}: expected 'KEY' or 'KEY LIMIT', got {line!r}")
        keys[fields[0]] = int(fields[1]) if len(fields) == 2 else None
    return keys


def load_keys(settings: AccessConfig, environ: Mapping[str, str] | None = None) -> dict:
    """The API keys of `settings` (file and environment variable); empty when keys are off."""
    environ = os.environ if environ is None else environ
    keys: dict[str, int | None] = {}
    if settings.api_keys_file:
        path = Path(settings.api_keys_file)
        if not path.is_file():
            raise ConfigError(f"api_keys_file {path} does not exist")
        keys.update(parse_keys(path.read_text(encoding="utf-8"), str(path)))
    if settings.api_keys_env and environ.get(settings.api_keys_env):
        text = environ[settings.api_keys_env].replace(",", "\n")
        keys.update(parse_keys(text, f"${settings.api_keys_env}"))
    if (settings.require_api_key or settings.require_api_key_origin) and not keys:
        raise ConfigError(
            "require_api_key needs API keys: set api_keys_file or the "
            f"{settings.api_keys_env or 'api_keys_env'} variable"
        )
    return keys


def exposure_warning(host: str, keys_on: bool) -> str | None:
    """A warning when the server listens on every interface with no API keys."""
    if str(host) in ANY_HOST and not keys_on:
        return (
            f"host={host} serves every network interface without API keys: anyone who can "
            "reach this port can use the model (set api_keys_file or require_api_key, or "
            "host=127.0.0.1 behind a reverse proxy)"
        )
    return None


class AccessGuard:
    """Checks a request's API key and rate limit; `check` answers None (go on) or the error.

    `clock` (seconds, monotonic) is injectable for tests.
    """

    def __init__(
        self,
        settings: AccessConfig | None = None,
        *,
        keys: dict[str, int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or AccessConfig()
        self.keys = load_keys(self.settings) if keys is None else dict(keys)
        self.clock = clock
        self._origin = (
            re.compile(self.settings.require_api_key_origin)
            if self.settings.require_api_key_origin
            else None
        )
        # who → times of its hits in the window; ordered by last hit, the idlest first
        self._hits: OrderedDict[str, deque[float]] = OrderedDict()
        self.max_clients = MAX_CLIENTS
        self._lock = threading.Lock()
        redact_keys_in_logs(self.keys)

    @property
    def keys_on(self) -> bool:
        return bool(self.keys)

    def close(self) -> None:
        """The server stops: its keys are no longer redacted from log text."""
        forget_keys_in_logs(self.keys)

    def client_ip(self, request: Any) -> str:
        """The client the limits count (`identity`: an IPv6 client is its /64): the peer, or
        behind a trusted proxy the last X-Forwarded-For address that is not one, every line
        of the header read (`TrustedProxies.client`)."""
        peer = request.client.host if request.client else "127.0.0.1"
        headers = request.headers
        lines = (
            headers.getlist("x-forwarded-for")
            if hasattr(headers, "getlist")
            else [v for k, v in headers.items() if k.lower() == "x-forwarded-for"]
        )
        return identity(
            self.settings.proxies.client(peer, lines, trust_peer=self.settings._trust_peer)
        )

    def check(self, request: Any, params: Mapping[str, Any], cost: int = 1) -> Any | None:
        """None when `request` (with its parsed body `params`) may go on; else the
        403/429 JSONResponse in LibreTranslate's ``{"error": ...}`` shape.

        `cost`: how many requests it counts as, as LibreTranslate charges them: ``len(q)``
        for a list of texts, file bytes / char_limit for a file (at least 1)."""
        from fastapi.responses import JSONResponse

        key = params.get("api_key") or None
        key = str(key) if key is not None else None
        limit = int(self.settings.req_limit)
        if self.keys_on:
            if key is not None and key not in self.keys:
                # a guess counts against its address's own wrong-key limit (even with no
                # req_limit) and is a hit of its address: guessing keys runs into a 429
                ip = self.client_ip(request)
                wrong = int(self.settings.wrong_key_limit)
                wait = self._hit(f"wrong-key:{ip}", wrong) if wrong >= 0 else None
                if wait is not None:
                    return _slowdown(wrong, wait)
                wait = self._hit(f"ip:{ip}", limit) if limit >= 0 else None
                if wait is not None:
                    return _slowdown(limit, wait)
                return JSONResponse({"error": INVALID_KEY}, status_code=403)
            if key is None and self._key_required(request):
                return JSONResponse({"error": NEED_KEY}, status_code=403)
            if key is not None and self.keys[key] is not None:
                limit = int(self.keys[key])  # the key's own limit
        else:
            key = None  # keys off: an api_key field is ignored, as LibreTranslate does
        if limit < 0:
            return None
        who = f"key:{key}" if key is not None else f"ip:{self.client_ip(request)}"
        wait = self._hit(who, limit, cost)
        return None if wait is None else _slowdown(limit, wait)

    def _key_required(self, request: Any) -> bool:
        if self.settings.require_api_key:
            return True
        if self._origin is not None:
            return not self._origin.fullmatch(request.headers.get("origin", ""))
        return False

    def _hit(self, who: str, limit: int, cost: int = 1) -> float | None:
        """Count `cost` requests of `who` in the sliding window: None if allowed, else the
        seconds until its oldest counted request leaves the window (a whole window when a
        single request costs more than `limit`).

        The table is ordered by last counted hit, so forgetting idle clients pops from its
        front: amortised O(1) per request. Past `max_clients` the least recently seen goes
        too (its count is lost: the price of a bounded table)."""
        with self._lock:
            now = self.clock()
            while self._hits:  # the idlest first: stop at the first one still in the window
                oldest, oldest_hits = next(iter(self._hits.items()))
                if oldest_hits and oldest_hits[-1] > now - WINDOW_S:
                    break
                del self._hits[oldest]
            hits = self._hits.get(who, deque())
            while hits and hits[0] <= now - WINDOW_S:
                hits.popleft()
            cost = max(1, int(cost))
            if len(hits) + cost > limit:  # refused: not a hit, so its place in the order stays
                return hits[0] + WINDOW_S - now if hits else WINDOW_S
            hits.extend([now] * cost)
            self._hits[who] = hits
            self._hits.move_to_end(who)  # the most recently seen
            while len(self._hits) > self.max_clients:
                self._hits.popitem(last=False)
            return None


def _slowdown(limit: int, wait: float) -> Any:
    """The 429 of a client over `limit`; `wait`: seconds until its oldest hit leaves."""
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": f"Slowdown: {limit} per 1 minute"},
        status_code=429,
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
    )


def cors_origins(cors: Any) -> list[str]:
    """Allowed origins of a ``cors`` setting: false/null/[] → none (same origin only),
    true or ``"*"`` → ``["*"]``, a string or a list → those origins."""
    if cors is None or cors is False:
        return []
    if cors is True:
        return ["*"]
    if isinstance(cors, str):
        return [o.strip() for o in cors.split(",") if o.strip()]
    origins = [str(o) for o in cors]
    if not all(origins):
        raise ConfigError(f"cors: empty origin in {origins}")
    return origins


def install_cors(app: Any, cors: Any) -> None:
    """Add the CORS middleware for `cors` (see `cors_origins`); nothing when it is off."""
    origins = cors_origins(cors)
    if not origins:
        return
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,  # LibreTranslate's after_request headers
        allow_origins=origins,
        allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type"],
        max_age=60 * 60 * 24 * 20,
    )


def __getattr__(name: str) -> Any:
    """Old names of this module's classes, kept one release (`litmt.config.renamed_attribute`)."""
    return renamed_attribute(__name__, name, {"AccessSettings": "AccessConfig"}, globals())
