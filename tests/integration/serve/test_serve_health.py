"""``/health`` tells the truth about the model thread: the age of its current job, and a 503
while that job runs past ``request_timeout_s`` (the thread cannot be interrupted; an
orchestrator should restart the server), back to 200 once it ends."""

from __future__ import annotations

import threading
import time

import httpx
from server_thread import ServerThread

from litmt.deploy.server.app import ServeConfig, create_app


class _Stuck:
    """A translator whose batch containing "hang" blocks until `release` is set."""

    src_lang, tgt_lang = "en", "de"

    def __init__(self) -> None:
        self.release = threading.Event()

    def translate(self, texts: list[str], **options) -> list[str]:
        if any("hang" in t for t in texts):
            self.release.wait(30)
        return [t.upper() for t in texts]


def test_health_reports_a_job_stuck_past_the_request_timeout_and_recovers():
    stuck = _Stuck()
    app = create_app(stuck, ServeConfig(max_wait_ms=0, request_timeout_s=1.0))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=30) as c:
        idle = c.get("/health")
        assert idle.status_code == 200 and idle.json()["job_age_s"] == 0.0
        hanging = threading.Thread(
            target=lambda: httpx.post(
                running.url + "/translate",
                json={"q": "hang", "source": "en", "target": "de"},
                timeout=30,
            )
        )
        hanging.start()
        try:
            time.sleep(0.3)
            early = c.get("/health")  # busy, within the timeout: still well
            assert early.status_code == 200 and 0.0 < early.json()["job_age_s"] < 1.0
            deadline = time.monotonic() + 10
            while (r := c.get("/health")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert r.status_code == 503, r.json()
            body = r.json()
            assert body["job_age_s"] > 1.0
            assert body["status"].startswith("unavailable: the model thread's job has run ")
            assert "past request_timeout_s=1" in body["status"]
        finally:
            stuck.release.set()
            hanging.join(30)
        deadline = time.monotonic() + 10
        while (r := c.get("/health")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert r.json()["job_age_s"] == 0.0
