"""Operator controls of the HTTP server: API keys, a rate limit and the CORS policy.

Behaviour and messages follow LibreTranslate (``libretranslate/app.py``, ``access_check``,
``get_req_limits`` and its error handlers; ``api_keys.py``; ``main.py``'s flags):

- Keys are off unless ``api_keys_file`` or the ``api_keys_env`` variable gives some. With
  keys on, a request may carry ``api_key`` (in its JSON, form or multipart body, as
  LibreTranslate reads it). A key that is not known → 403 ``{"error": "Invalid API key"}``.
  A request without one is served at the default limit (``--api-keys``), unless keys are
  required (``require_api_key``, or ``require_api_key_origin`` and an ``Origin`` header that
  does not match that regex) → 403 ``{"error": "Please contact the server operator to get an
  API key"}``. (LibreTranslate answers that one with 400; issue 24 asks for 403.)
- Rate limit (``--req-limit``): requests per minute, counted per API key when one is given
  and per client IP otherwise, in a moving window of 60 s. A key may carry its own limit
  (LibreTranslate's ``req_limit`` column): ``KEY LIMIT`` on its line. Over it → 429
  ``{"error": "Slowdown: N per 1 minute"}`` with ``Retry-After``. ``-1`` = no limit.
- CORS: none by default (same origin only: no ``Access-Control-*`` headers); ``"*"`` (or
  ``true``) for every origin as LibreTranslate does; or a list of allowed origins.

The counts live in memory, per server process.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litmt.config import renamed_attribute
from litmt.errors import ConfigError

INVALID_KEY = "Invalid API key"  # LibreTranslate's message
NEED_KEY = "Please contact the server operator to get an API key"  # LibreTranslate's message
WINDOW_S = 60.0  # req_limit is per minute
ANY_HOST = ("0.0.0.0", "::", "")


@dataclass
class AccessConfig:
    """API keys and the rate limit: the ``access`` block of ``conf/serve.yaml`` (each field's
    docstring is its one documentation, shown there as the key's comment)."""

    api_keys_file: str | None = None
    """API keys, one per line ("KEY" or "KEY LIMIT": its own requests/minute); null = none. A
    bad api_key gets 403"""
    api_keys_env: str | None = "LITMT_API_KEYS"
    """environment variable with more keys (comma- or space-separated); '' = none. Keys are on
    when the file or the variable gives any"""
    require_api_key: bool = False
    """true: a request without api_key gets 403; false: it is served at req_limit per IP"""
    require_api_key_origin: str | None = None
    """regex (LibreTranslate's --require-api-key-origin): a request needs a key unless its
    Origin matches"""
    req_limit: int = -1
    """requests per minute per API key (or per client IP without one), else 429 "Slowdown: N
    per 1 minute"; -1 = no limit"""
    trust_forwarded_for: bool = False
    """per-IP limit on X-Forwarded-For's first address (only behind your own reverse proxy)"""

    def __post_init__(self) -> None:
        if int(self.req_limit) == 0 or int(self.req_limit) < -1:
            raise ConfigError(f"req_limit must be positive or -1 (no limit), got {self.req_limit}")
        if self.require_api_key_origin:
            try:
                re.compile(self.require_api_key_origin)
            except re.error as exc:
                raise ConfigError(f"require_api_key_origin is not a regex: {exc}") from None


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
        self._hits: dict[str, deque[float]] = {}

    @property
    def keys_on(self) -> bool:
        return bool(self.keys)

    def client_ip(self, request: Any) -> str:
        forwarded = request.headers.get("x-forwarded-for")
        if self.settings.trust_forwarded_for and forwarded:
            return forwarded.split(",")[0].strip()
        return request.client.host if request.client else "127.0.0.1"

    def check(self, request: Any, params: Mapping[str, Any]) -> Any | None:
        """None when `request` (with its parsed body `params`) may go on; else the
        403/429 JSONResponse in LibreTranslate's ``{"error": ...}`` shape."""
        from fastapi.responses import JSONResponse

        key = params.get("api_key") or None
        key = str(key) if key is not None else None
        limit = int(self.settings.req_limit)
        if self.keys_on:
            if key is not None and key not in self.keys:
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
        wait = self._hit(who, limit)
        if wait is None:
            return None
        return JSONResponse(
            {"error": f"Slowdown: {limit} per 1 minute"},
            status_code=429,
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )

    def _key_required(self, request: Any) -> bool:
        if self.settings.require_api_key:
            return True
        if self._origin is not None:
            return not self._origin.match(request.headers.get("origin", ""))
        return False

    def _hit(self, who: str, limit: int) -> float | None:
        """Count one request of `who` in the moving window: None if allowed, else the
        seconds until the oldest counted request leaves the window."""
        now = self.clock()
        if len(self._hits) > 10_000:  # forget idle clients: memory stays bounded
            for name in [n for n, q in self._hits.items() if not q or q[-1] <= now - WINDOW_S]:
                del self._hits[name]
        hits = self._hits.setdefault(who, deque())
        while hits and hits[0] <= now - WINDOW_S:
            hits.popleft()
        if len(hits) >= limit:
            return hits[0] + WINDOW_S - now
        hits.append(now)
        return None


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
