"""Issue 55's findings on a real uvicorn on loopback: forwarded addresses read by uvicorn's
rule (every X-Forwarded-For line), wrong API keys always counted, nothing internal in a 500,
keys redacted in any encoding (tracebacks included), and logs that one client cannot flood.
"""

from __future__ import annotations

import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server import log_redaction  # noqa: E402
from litmt.deploy.server.access import AccessConfig  # noqa: E402
from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402
from litmt.errors import ConfigError  # noqa: E402

Q = {"q": "hello", "source": "en", "target": "de"}
# the loggers a server writes to: litmt's propagate to the root, uvicorn's do not
SERVER_LOGGERS = ("", "uvicorn.error", "uvicorn.access")


class _Upper:
    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        return [t.upper() for t in texts]


class _Failing(_Upper):
    """A translator whose every batch fails with internal text (a path, the batch)."""

    def translate(self, texts: list[str], **options) -> list[str]:
        raise RuntimeError(f"CUDA error at /srv/secret/model.py while decoding {texts!r}")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Records(logging.Handler):
    """Every record the server's loggers write while it is attached (`_records`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        """Each record as a formatter writes it (its traceback included)."""
        return [self.format(r) for r in self.records]


_LOGS: list[_Records] = []  # the `logs` fixture's handler, while a test holds it


@pytest.fixture
def logs() -> Iterator[_Records]:
    """The server's log records, uvicorn's access lines included; the repeat throttle starts
    afresh (it is per process). uvicorn's logging setup drops the handlers of its loggers
    and sets their levels when a server is made, so `_serve` attaches this one after."""
    throttle = getattr(log_redaction, "_THROTTLE", None)
    if throttle is not None:
        throttle.seen.clear()
    handler = _Records()
    _LOGS.append(handler)
    _attach(handler)
    access_log = logging.getLogger("uvicorn.access")
    level = access_log.level
    try:
        yield handler
    finally:
        _LOGS.remove(handler)
        for name in SERVER_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        access_log.setLevel(level)


def _attach(handler: _Records) -> None:
    for name in SERVER_LOGGERS:
        if handler not in logging.getLogger(name).handlers:
            logging.getLogger(name).addHandler(handler)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO)  # where a query string shows


def _serve(translator=None, access: AccessConfig | None = None, **settings) -> ServerThread:
    config = ServeConfig(
        max_wait_ms=0, access=access or AccessConfig(api_keys_env=None), **settings
    )
    app = create_app(translator or _Upper(), config)
    app.state.access_guard.clock = _Clock()  # one minute lasts the whole test
    running = ServerThread(app, proxy_headers=False)
    for handler in _LOGS:
        _attach(handler)
    return running


def _raw(port: int, request: bytes, *, close_after: float | None = None) -> bytes:
    """Send `request` as it is; the answer (or b"" when `close_after`: hang up then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        if close_after is not None:
            time.sleep(close_after)
            return b""
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


# --- finding 4 (Build 5): forwarded addresses by uvicorn's rule ---


def _behind_proxy(lines: list[list[str]], **access) -> list[int]:
    """One request per entry of `lines`, each with those X-Forwarded-For lines, from a
    trusted proxy on loopback with req_limit=5."""
    settings = AccessConfig(
        api_keys_env=None, req_limit=5, forwarded_allow_ips="127.0.0.1", **access
    )
    with _serve(access=settings) as running, httpx.Client(base_url=running.url) as c:
        return [
            c.post(
                "/translate", json=Q, headers=[("X-Forwarded-For", line) for line in request]
            ).status_code
            for request in lines
        ]


def test_a_forged_first_x_forwarded_for_line_behind_a_proxy_gets_429_from_the_6th():
    """What HAProxy's ``option forwardfor`` sends: the client's (forged) line, then its own."""
    codes = _behind_proxy([[f"198.51.100.{i}", "203.0.113.7"] for i in range(20)])
    assert codes == [200] * 5 + [429] * 15


def test_an_ipv6_client_is_its_64_and_junk_falls_back_to_the_peer():
    codes = _behind_proxy([["2001:db8:1:2::1", f"2001:db8:5:6::{i:x}"] for i in range(8)])
    assert codes == [200] * 5 + [429] * 3  # one /64: one client
    codes = _behind_proxy([[f"unknown-{i}"] for i in range(8)])
    assert codes == [200] * 5 + [429] * 3  # not an IP address: counted on the peer


def test_forwarded_allow_ips_star_is_refused():
    with pytest.raises(ConfigError, match=r'^forwarded_allow_ips: "\*" would let any client'):
        AccessConfig(forwarded_allow_ips="*")
    with pytest.raises(ConfigError, match=r'"\*"'):
        AccessConfig(forwarded_allow_ips=["10.0.0.0/8", "*"])


# --- finding 10 (Build 9): wrong keys are always counted ---


def test_wrong_keys_are_limited_with_no_req_limit(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("good-key\n")
    access = AccessConfig(api_keys_file=str(keys), api_keys_env=None)
    assert access.req_limit == -1 and access.wrong_key_limit == 10
    with _serve(access=access) as running, httpx.Client(base_url=running.url) as c:
        codes = [
            c.post("/translate", json={**Q, "api_key": f"guess-{i}"}).status_code for i in range(12)
        ]
        assert codes == [403] * 10 + [429] * 2
        r = c.post("/translate", json={**Q, "api_key": "guess-x"})
        assert r.json() == {"error": "Slowdown: 10 per 1 minute"} and "retry-after" in r.headers
        assert c.post("/translate", json={**Q, "api_key": "good-key"}).status_code == 200
        assert c.post("/translate", json=Q).status_code == 200  # no req_limit: still served


# --- finding 9 (Build 8): nothing internal leaks ---


def test_a_500_carries_an_error_id_and_the_log_the_detail(logs):
    with _serve(_Failing()) as running, httpx.Client(base_url=running.url) as c:
        r = c.post("/translate", json=Q)
    assert r.status_code == 500
    match = re.fullmatch(r"internal error, id ([0-9a-f]{12})", r.json()["error"])
    assert match, r.text
    logged = [line for line in logs.lines() if f"id {match[1]}" in line]
    assert len(logged) == 1, logs.lines()
    assert "/srv/secret/model.py" in logged[0] and "Traceback" in logged[0]


def test_keys_are_redacted_by_field_in_any_encoding_tracebacks_included(tmp_path, logs):
    secret = "k;e,y'q\"u}o]te-s3cret"
    wrong = "wr;ong,gu'e\"ss}]-k3y"
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{secret}\n")
    access = AccessConfig(api_keys_file=str(keys), api_keys_env=None)
    with _serve(access=access) as running, httpx.Client(base_url=running.url) as c:
        form = {"content": urllib.parse.urlencode(Q)}
        form["headers"] = {"content-type": "application/x-www-form-urlencoded"}
        quoted = urllib.parse.quote(secret, safe="")
        assert c.post(f"/translate?api%5Fkey={quoted}", **form).status_code == 200
        assert c.post(f"/translate?API_KEY={quoted}", **form).status_code == 200
        raw = _raw(
            running.port,
            f"GET /languages?api_key={wrong} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        )
        assert raw.startswith(b"HTTP/1.1 200")
    with _serve(_Failing(), access=access) as running, httpx.Client(base_url=running.url) as c:
        body = {**Q, "q": f'{{"api_key": "{wrong}"}} and {{"api_key": "{secret}"}}'}
        assert c.post("/translate", json=body).status_code == 500
    logging.getLogger("litmt.deploy.test").warning("body: %s", {"api_key": wrong})
    lines = logs.lines()
    assert any("api%5Fkey=***" in line for line in lines), lines
    assert any("Traceback" in line and "/srv/secret" in line for line in lines), lines
    pieces = {"s3cret", 'q\\"u', "u}o", "k%3Be", "%3Be%2C", ";ong", "gu'e", "ss}]", "k3y"}
    leaks = [(p, line) for line in lines for p in pieces if p in line]
    assert not leaks, leaks


# --- finding 8 (Build 7): logs cannot be flooded ---


def test_control_characters_log_one_line_per_request_not_per_unit(reference, logs):
    """25 texts of 100 control characters (50 lines each, 1,250 units): at most 50 lines."""
    texts = ["\x01\n" * 50] * 25
    app_settings = {"max_lines": 100}
    with _serve(reference, **app_settings) as running, httpx.Client(base_url=running.url) as c:
        r = c.post("/translate", json={"q": texts, "source": "en", "target": "de"}, timeout=120)
    assert r.status_code == 200, r.text
    assert len(logs.records) <= 50, logs.lines()[:5]
    assert any("removed 1250 control character(s)" in line for line in logs.lines())


def test_clean_line_still_warns_for_other_callers(caplog):
    from litmt.data.text import clean_line

    with caplog.at_level(logging.WARNING, logger="litmt.data.text"):
        assert clean_line("a\x01b\x02", "line 3") == "ab"
    assert caplog.messages == ["line 3: removed 2 control character(s)"]


def test_a_client_gone_mid_body_logs_one_line_without_a_traceback(logs):
    head = (
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    with _serve() as running:
        _raw(running.port, head + b'{"q": ', close_after=0.3)
        deadline = time.monotonic() + 5
        while not logs.records and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything else it would log
    lines = logs.lines()
    assert len(lines) == 1, lines
    assert "went before its body was in" in lines[0]
    assert not any(r.exc_info for r in logs.records), lines


def test_connection_upgrade_does_not_log_warnings_per_request(logs):
    with _serve() as running, httpx.Client(base_url=running.url) as c:
        for _ in range(10):
            r = c.get("/health", headers={"Connection": "upgrade", "Upgrade": "websocket"})
            assert r.status_code == 200
    warned = [r for r in logs.records if r.name == "uvicorn.error"]
    assert len(warned) <= 2, [r.getMessage() for r in warned]  # once each, not 2 per request
