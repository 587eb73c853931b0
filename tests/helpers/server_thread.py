"""`ServerThread`: an app served by uvicorn in a background thread (a test helper; the
product runs uvicorn from `litmt.cli.serve`)."""

from __future__ import annotations

import threading
import time
from typing import Any


class ServerThread:
    """Run an app with uvicorn in a background thread (tests, benchmarks).

    >>> with ServerThread(app) as server:
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn: Any) -> None:
        """Run as `litmt.cli.serve` runs uvicorn (litmt's HTTP protocol, bound to the app's
        `ServeConfig`); `uvicorn`: more or other `uvicorn.Config` options."""
        from uvicorn import Config, Server

        from litmt.deploy.server.protocol import uvicorn_options

        context = getattr(app.state, "context", None)
        options = uvicorn_options(context.settings) if context is not None else {}
        options.update(uvicorn)
        config = Config(app, host=host, port=port, log_level="warning", lifespan="on", **options)
        self.server = Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="litmt-serve")
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


__all__ = ["ServerThread"]
