"""Operator controls of the server: API keys (403), the rate limit (429) and CORS.

Messages and shapes are LibreTranslate's (``libretranslate/app.py``: ``access_check``, the
403/429 error handlers, ``after_request``). A toy translator keeps these fast.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.access import (  # noqa: E402
    AccessConfig,
    AccessGuard,
    exposure_warning,
    load_keys,
)
from litmt.deploy.server.app import ServeConfig, create_app  # noqa: E402
from litmt.errors import ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
Q = {"q": "hello", "source": "en", "target": "de"}


class _Upper:
    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        return [t.upper() for t in texts]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _serve(access: AccessConfig | None = None, cors=False, clock=None):
    """A running toy server; `clock` replaces the guard's time."""
    settings = ServeConfig(max_wait_ms=0, cors=cors, access=access or AccessConfig())
    app = create_app(_Upper(), settings)
    if clock is not None:
        app.state.access_guard.clock = clock
    return ServerThread(app, proxy_headers=False)  # as litmt.cli.serve runs uvicorn


def _keys(tmp_path, text: str, **access) -> AccessConfig:
    """Access settings with an API key file holding `text`."""
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return AccessConfig(api_keys_file=str(path), api_keys_env=None, **access)


def _client(running):
    return httpx.Client(base_url=running.url, timeout=30)


def test_keys_optional_bad_key_is_403_and_no_key_is_served(tmp_path):
    with _serve(_keys(tmp_path, "good\n")) as running, _client(running) as c:
        r = c.post("/translate", json={**Q, "api_key": "bad"})
        assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}
        r = c.post("/translate", data={**Q, "api_key": "bad"})  # form body too
        assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}
        assert c.post("/translate", json={**Q, "api_key": "good"}).json() == {
            "translatedText": "HELLO"
        }
        assert c.post("/translate", json=Q).json() == {"translatedText": "HELLO"}


def test_keys_required_missing_key_is_403(tmp_path):
    access = _keys(tmp_path, "good\n", require_api_key=True)
    with _serve(access) as running, _client(running) as c:
        r = c.post("/translate", json=Q)
        assert r.status_code == 403
        assert r.json() == {"error": "Please contact the server operator to get an API key"}
        assert c.post("/translate", json={**Q, "api_key": "good"}).status_code == 200
        assert c.get("/languages").status_code == 200  # metadata needs no key


def test_require_api_key_origin_lets_the_matching_origin_through(tmp_path):
    access = _keys(tmp_path, "good\n", require_api_key_origin=r"https://ui\.example")
    with _serve(access) as running, _client(running) as c:
        assert (
            c.post("/translate", json=Q, headers={"Origin": "https://ui.example"}).status_code
            == 200
        )
        r = c.post("/translate", json=Q, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403
        assert c.post("/translate", json=Q).status_code == 403


def test_rate_limit_is_429_per_ip_and_per_key_and_the_window_moves(tmp_path):
    clock = _Clock()
    access = _keys(tmp_path, "small 1\nplain\n", req_limit=2)
    with (
        _serve(access, clock=clock) as running,
        _client(running) as c,
    ):
        assert [c.post("/translate", json=Q).status_code for _ in range(2)] == [200, 200]
        r = c.post("/translate", json=Q)
        assert r.status_code == 429 and r.json() == {"error": "Slowdown: 2 per 1 minute"}
        assert r.headers["retry-after"] == "60"
        # a key is counted apart from the IP, at its own limit or the default
        assert c.post("/translate", json={**Q, "api_key": "plain"}).status_code == 200
        assert c.post("/translate", json={**Q, "api_key": "small"}).status_code == 200
        r = c.post("/translate", json={**Q, "api_key": "small"})
        assert r.status_code == 429 and r.json() == {"error": "Slowdown: 1 per 1 minute"}
        clock.now += 30
        assert c.post("/translate", json=Q).status_code == 429  # still inside the minute
        clock.now += 30.5
        assert c.post("/translate", json=Q).status_code == 200  # the first ones left it


def test_no_limit_by_default():
    guard = AccessGuard(AccessConfig(api_keys_env=None))
    assert not guard.keys_on and guard.settings.req_limit == -1
    with _serve(clock=_Clock()) as running, _client(running) as c:
        assert all(c.post("/translate", json=Q).status_code == 200 for _ in range(5))


def test_keys_from_a_file_and_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "keys.txt"
    path.write_text("# operators\nalpha\nbeta 30  # beta's own limit\n\n")
    monkeypatch.setenv("LITMT_TEST_KEYS", "gamma, delta 5")
    keys = load_keys(AccessConfig(api_keys_file=str(path), api_keys_env="LITMT_TEST_KEYS"))
    assert keys == {"alpha": None, "beta": 30, "gamma": None, "delta": 5}
    path.write_text("alpha beta gamma\n")
    with pytest.raises(ConfigError, match=r"keys\.txt:1"):
        load_keys(AccessConfig(api_keys_file=str(path), api_keys_env=None))
    with pytest.raises(ConfigError, match="does not exist"):
        load_keys(AccessConfig(api_keys_file=str(tmp_path / "none"), api_keys_env=None))
    with pytest.raises(ConfigError, match="needs API keys"):
        load_keys(AccessConfig(require_api_key=True, api_keys_env=None))
    with pytest.raises(ConfigError, match="req_limit"):
        AccessConfig(req_limit=0)


def test_cors_is_same_origin_by_default():
    with _serve() as running, _client(running) as c:
        r = c.get("/languages", headers={"Origin": "https://example.org"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        r = c.options(
            "/translate",
            headers={"Origin": "https://example.org", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in r.headers


def test_cors_star_only_when_asked_and_an_allow_list():
    with _serve(cors="*") as running, _client(running) as c:
        r = c.options(
            "/translate",
            headers={"Origin": "https://example.org", "Access-Control-Request-Method": "POST"},
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        r = c.get("/languages", headers={"Origin": "https://example.org"})
        assert r.headers["access-control-allow-origin"] == "*"
    with _serve(cors=["https://ui.example"]) as running, _client(running) as c:
        r = c.get("/languages", headers={"Origin": "https://ui.example"})
        assert r.headers["access-control-allow-origin"] == "https://ui.example"
        r = c.get("/languages", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers


def test_open_bind_without_keys_is_warned(monkeypatch, caplog):
    assert "0.0.0.0" in exposure_warning("0.0.0.0", keys_on=False)
    assert exposure_warning("0.0.0.0", keys_on=True) is None
    assert exposure_warning("127.0.0.1", keys_on=False) is None

    import uvicorn
    from hydra import compose, initialize_config_dir

    import litmt.cli.serve

    monkeypatch.delenv("LITMT_API_KEYS", raising=False)
    built: list[ServeConfig] = []
    monkeypatch.setattr(
        litmt.cli.serve, "build_server_app", lambda *a, **k: built.append(k["settings"])
    )
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        overrides = ["ckpt_path=m.ckpt", f"host={host}", "access.req_limit=7", "cors=[https://a.b]"]
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name="serve", overrides=overrides)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="litmt.cli.serve"):
            litmt.cli.serve.serve(cfg)
        assert any("without API keys" in m for m in caplog.messages) == warned
    assert built[-1].access.req_limit == 7 and built[-1].cors == ["https://a.b"]


def test_keys_guard_every_libretranslate_route(tmp_path):
    """/detect and /translate_file check the key as /translate does; /frontend/settings says
    whether keys are on and required."""
    access = _keys(tmp_path, "good\n", require_api_key=True)
    with _serve(access) as running, _client(running) as c:
        for route, kwargs in (
            ("/translate", {"json": Q}),
            ("/detect", {"json": {"q": "hello"}}),
            ("/translate_file", {"data": {"source": "en", "target": "de"},
                                 "files": {"file": ("a.txt", b"hello\n")}}),
        ):  # fmt: skip
            r = c.post(route, **kwargs)
            assert r.status_code == 403, (route, r.status_code, r.text)
        assert c.post("/detect", json={"q": "hello", "api_key": "good"}).status_code == 200
        settings = c.get("/frontend/settings").json()
        assert (settings["apiKeys"], settings["keyRequired"]) == (True, True)
    with _serve() as running, _client(running) as c:
        settings = c.get("/frontend/settings").json()
        assert (settings["apiKeys"], settings["keyRequired"]) == (False, False)


# --- issue 43, item 5: keys and origins ---


def _request(ip: str = "10.0.0.1", origin: str | None = None):
    """A stand-in for a Starlette request: what `AccessGuard.check` reads."""
    from types import SimpleNamespace

    headers = {"origin": origin} if origin is not None else {}
    return SimpleNamespace(headers=headers, client=SimpleNamespace(host=ip))


def test_require_api_key_origin_is_matched_in_full(tmp_path):
    access = _keys(tmp_path, "good\n", require_api_key_origin=r"https://ui\.example")
    with _serve(access) as running, _client(running) as c:
        r = c.post("/translate", json=Q, headers={"Origin": "https://ui.example.evil.net"})
        assert r.status_code == 403, r.text
        assert r.json() == {"error": "Please contact the server operator to get an API key"}
        r = c.post("/translate", json=Q, headers={"Origin": "https://ui.example"})
        assert r.status_code == 200


def test_a_wrong_key_counts_against_its_address_so_guesses_get_429(tmp_path):
    clock = _Clock()
    access = _keys(tmp_path, "good\n", req_limit=3)
    with _serve(access, clock=clock) as running, _client(running) as c:
        codes = [
            c.post("/translate", json={**Q, "api_key": f"guess-{i}"}).status_code for i in range(5)
        ]
        assert codes == [403, 403, 403, 429, 429]
        r = c.post("/translate", json=Q)  # the address itself is spent too
        assert r.status_code == 429 and r.json() == {"error": "Slowdown: 3 per 1 minute"}
        # the right key is counted apart, so its owner is not locked out by the guesses
        assert c.post("/translate", json={**Q, "api_key": "good"}).status_code == 200


def test_api_keys_are_redacted_from_log_lines(tmp_path):
    """uvicorn's access line (a key in the query string) and any litmt line carry no key."""
    secret = "k-s3cret-alice"
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = _Keep()
    access_log = logging.getLogger("uvicorn.access")
    access = _keys(tmp_path, f"{secret}\n")
    with _serve(access) as running, _client(running) as c:
        level = access_log.level
        access_log.addHandler(keep)
        access_log.setLevel(logging.INFO)
        try:
            r = c.post(f"/translate?api_key={secret}", data=Q)
            assert r.status_code == 200
            r = c.post("/translate?api_key=not-a-key-at-all", data=Q)
            assert r.status_code == 403
        finally:
            access_log.removeHandler(keep)
            access_log.setLevel(level)
    caught: list[logging.LogRecord] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    test_log = logging.getLogger("litmt.deploy.test")
    test_log.addHandler(catch := _Catch())
    try:
        test_log.warning("body: %s", {"api_key": secret})
        test_log.warning(f"params api_key={secret} q=hi")
    finally:
        test_log.removeHandler(catch)
    lines = [r.getMessage() for r in records + caught]
    assert any("/translate?api_key=" in line for line in lines), lines
    assert len(caught) == 2, lines
    assert not any(secret in line or "not-a-key-at-all" in line for line in lines), lines


def test_the_limiter_table_is_bounded_and_forgets_idle_clients():
    clock = _Clock()
    guard = AccessGuard(AccessConfig(api_keys_env=None, req_limit=5), clock=clock)
    for i in range(100):  # idle clients leave the table on the next request, not past 10,000
        assert guard.check(_request(f"10.0.{i // 256}.{i % 256}"), {}) is None
    clock.now += 61
    assert guard.check(_request("10.9.9.9"), {}) is None
    assert len(guard._hits) == 1
    for i in range(10_050):  # all live in the same minute: the table still has a bound
        assert guard.check(_request(f"fd00:{i:x}::1"), {}) is None  # one /64 each
    assert len(guard._hits) <= 10_000


def test_the_window_slides_rather_than_resets():
    """At its limit a client is served again when its oldest hit leaves the minute; a fixed
    window (reset 60 s after the first hit) would serve both requests after 60 s."""
    clock = _Clock()
    guard = AccessGuard(AccessConfig(api_keys_env=None, req_limit=2), clock=clock)
    start = clock.now
    assert guard.check(_request(), {}) is None  # t = 0
    clock.now = start + 30
    assert guard.check(_request(), {}) is None  # t = 30
    clock.now = start + 45
    r = guard.check(_request(), {})
    assert r.status_code == 429 and r.headers["retry-after"] == "15"
    clock.now = start + 60.5
    assert guard.check(_request(), {}) is None  # the t = 0 hit left the minute
    clock.now = start + 61
    r = guard.check(_request(), {})  # t = 30 and t = 60.5 are still in it
    assert r is not None and r.status_code == 429
    assert r.headers["retry-after"] == "29"  # the t = 30 hit leaves at t = 90
    clock.now = start + 90.5
    assert guard.check(_request(), {}) is None


def _forged_burst(access: AccessConfig, n: int = 20) -> list[int]:
    """`n` requests from this host (127.0.0.1) as a proxy sends them: each with a different
    forged leftmost X-Forwarded-For address and the same real client appended by the proxy."""
    with _serve(access, clock=_Clock()) as running, _client(running) as c:
        return [
            c.post(
                "/translate", json=Q, headers={"X-Forwarded-For": f"10.9.{i}.1, 203.0.113.7"}
            ).status_code
            for i in range(n)
        ]


def test_a_forged_x_forwarded_for_behind_a_trusted_proxy_does_not_escape_the_limit():
    codes = _forged_burst(
        AccessConfig(api_keys_env=None, req_limit=5, forwarded_allow_ips="127.0.0.1")
    )
    assert codes == [200] * 5 + [429] * 15  # the client is 203.0.113.7, what the proxy saw


def test_x_forwarded_for_from_an_untrusted_peer_is_ignored():
    access = AccessConfig(api_keys_env=None, req_limit=5, forwarded_allow_ips=["10.0.0.0/8"])
    guard = AccessGuard(access, keys={})
    with _serve(access, clock=_Clock()) as running, _client(running) as c:
        codes = [
            c.post("/translate", json=Q, headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code
            for i in range(8)
        ]
    assert codes == [200] * 5 + [429] * 3  # counted on the peer, 127.0.0.1
    peer = type(
        "Request",
        (),
        {
            "client": type("C", (), {"host": "192.0.2.1"}),
            "headers": {"x-forwarded-for": "198.51.100.1"},
        },
    )
    assert guard.client_ip(peer) == "192.0.2.1"


def test_forwarded_allow_ips_reads_as_uvicorns():
    from litmt.deploy.server.access import TrustedProxies

    proxies = TrustedProxies("127.0.0.1, 10.0.0.0/8")
    assert proxies.client("10.1.2.3", "6.6.6.6, 1.2.3.4, 10.0.0.9") == "1.2.3.4"  # proxy chain
    assert proxies.client("10.1.2.3", "1.2.3.4:5678") == "1.2.3.4"  # a port is dropped
    assert proxies.client("10.1.2.3", "[2001:db8::1]:80") == "2001:db8::1"
    assert proxies.client("10.1.2.3", "10.0.0.1, 127.0.0.1") == "10.0.0.1"  # all proxies: first
    assert proxies.client("192.0.2.1", "1.2.3.4") == "192.0.2.1"  # not from a proxy
    assert proxies.client("127.0.0.1", None) == "127.0.0.1"
    # every line, joined in order as uvicorn joins them; the client must be an IP address
    assert proxies.client("10.1.2.3", ["6.6.6.6", "1.2.3.4, 10.0.0.9"]) == "1.2.3.4"
    assert proxies.client("10.1.2.3", ["1.2.3.4", "proxy-junk"]) == "10.1.2.3"
    with pytest.raises(ConfigError, match=r'^forwarded_allow_ips: "\*" would let any client'):
        TrustedProxies(["*"])  # uvicorn's "trust everyone": any client names its own address
    assert TrustedProxies(None).client("127.0.0.1", "1.2.3.4") == "127.0.0.1"  # the default
    with pytest.raises(ConfigError, match=r"^forwarded_allow_ips: 'proxy\.local' is not an IP"):
        AccessConfig(forwarded_allow_ips="127.0.0.1,proxy.local")


@pytest.mark.parametrize(
    "values",
    [{"trust_forwarded_for": True}, {"access": {"trust_forwarded_for": True}}],
    ids=["flat", "access"],
)
def test_the_old_trust_forwarded_for_trusts_the_peer_only_with_a_deprecation_line(values, caplog):
    from litmt.cli.serve import serve_config

    with caplog.at_level(logging.WARNING):
        access = serve_config(values).access
    assert [r.getMessage() for r in caplog.records] == [
        "serve: access.trust_forwarded_for is deprecated and will be removed in litmt 0.3.0; "
        "use access.forwarded_allow_ips (your proxies' addresses). Until then "
        "trust_forwarded_for=true trusts the direct peer as one proxy: the client is the last "
        "X-Forwarded-For address"
    ]
    access.req_limit, access.api_keys_env = 5, None
    assert _forged_burst(access) == [200] * 5 + [429] * 15  # the forged probe of issue 43
    with pytest.raises(ConfigError, match=r"trust_forwarded_for is the old form"):
        AccessConfig(trust_forwarded_for=True, forwarded_allow_ips="127.0.0.1")


def test_a_batch_costs_what_libretranslate_charges():
    """LibreTranslate charges len(q) for a list of texts (its app.py); counting a batch as one
    request would let it walk past req_limit. (A file costs its bytes / char_limit, at least
    1; litmt refuses a file over char_limit characters, so only multi-byte text costs more.)"""
    clock = _Clock()
    with (
        _serve(AccessConfig(api_keys_env=None, req_limit=5), clock=clock) as running,
        _client(running) as c,
    ):
        batch = {**Q, "q": ["a", "b", "c"]}
        assert c.post("/translate", json=batch).status_code == 200  # 3 of 5
        r = c.post("/translate", json=batch)  # 3 more would make 6
        assert r.status_code == 429 and r.json() == {"error": "Slowdown: 5 per 1 minute"}
        assert c.post("/translate", json=Q).status_code == 200  # one text still fits: 4
        assert c.post("/translate", json={**Q, "q": ["a"]}).status_code == 200  # 5
        assert c.post("/translate", json=Q).status_code == 429
        clock.now += 61  # the window is empty again
        assert c.post("/translate", json={**Q, "q": ["a"] * 5}).status_code == 200
        r = c.post("/translate", json={**Q, "q": ["a"] * 6})  # more than the limit at once
        assert r.status_code == 429
