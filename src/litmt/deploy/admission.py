"""The server's way into the model: every decoding a request asks for passes through here.

One worker thread runs the model (`Admission.executor`), so decoding never runs twice at
once. Plain translations are batched (`litmt.deploy.request_batcher.RequestBatcher`, one per
direction, all on that thread): the first request of a batch waits at most ``max_wait_ms``
for others, up to ``max_batch_sentences`` sentences. Other jobs (n-best lists, steered
requests, attention maps) run on the thread one by one (`Admission.run`).

What a request gets when it cannot be served: a full queue or a dead batcher → 503 with
``Retry-After``; past ``request_timeout_s`` → 504; a client that hung up while it waited →
its queued work is cancelled (the batcher skips it) and 499 is logged; a failing batch →
500 for its requests, never the server.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from litmt.deploy import libretranslate as lt
from litmt.deploy.http_errors import ApiError
from litmt.deploy.request_batcher import BatcherDead, QueueFull, RequestBatcher
from litmt.deploy.serve_config import ServeConfig
from litmt.errors import LitmtError

log = logging.getLogger(__name__)

Pair = tuple[str, str] | None  # a request's (source, target); None = a one-pair model
T = TypeVar("T")


class Admission:
    """The model's one worker thread, the batchers and the answers of requests that wait.

    Args:
        translator: the `Translator` (torch or ct2) that decodes.
        settings: the server's settings (batching, queue, timeout, Retry-After).
        options: `Translator.translate` keywords of every translation (decoding options).
    """

    def __init__(self, translator: Any, settings: ServeConfig, options: dict[str, Any]) -> None:
        self.translator, self.settings, self.options = translator, settings, options
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litmt-model")
        self.batchers: dict[Pair, RequestBatcher] = {}  # one per direction
        self.batcher: RequestBatcher | None = None  # the first direction's (`start`)

    def direction(self, pair: Pair) -> dict[str, Any]:
        """`Translator.translate` keywords of a direction ({} for a one-pair model)."""
        if pair is None:
            return {}
        return {
            "src_lang": pair[0],
            "tgt_lang": pair[1],
            "allow_zero_shot": self.settings.allow_zero_shot,
        }

    def batcher_for(self, pair: Pair) -> RequestBatcher:
        """The running batcher of a direction, started on first use (in the event loop)."""
        if pair not in self.batchers:
            keywords = {**self.options, **self.direction(pair)}
            batcher = RequestBatcher(
                lambda units: self.translator.translate(units, **keywords),
                self.executor,
                max_batch_sentences=self.settings.max_batch_sentences,
                max_wait_ms=self.settings.max_wait_ms,
                max_queue=self.settings.max_queue,
            )
            batcher.start()
            self.batchers[pair] = batcher
        return self.batchers[pair]

    def start(self, first: Pair) -> RequestBatcher:
        """Start the batcher of the model's first direction (the app's lifespan)."""
        self.batcher = self.batcher_for(first)
        return self.batcher

    async def stop(self) -> None:
        """Stop every batcher (their waiting requests fail) and the worker thread."""
        for batcher in list(self.batchers.values()):
            await batcher.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def unavailable(self, message: str) -> JSONResponse:
        """503 with LibreTranslate's error JSON and a Retry-After (seconds)."""
        headers = {"Retry-After": str(self.settings.retry_after_s)}
        return JSONResponse({"error": message}, status_code=503, headers=headers)

    def timed_out(self) -> ApiError:
        """The 504 of a request past ``request_timeout_s``."""
        return ApiError(
            504, f"Translation timed out (request_timeout_s={self.settings.request_timeout_s:g})"
        )

    async def run(self, job: Callable[[], T], *, timed: bool = True) -> T:
        """`job`'s result, run on the model's thread; 504 past ``request_timeout_s``
        (`timed`; an untimed job is waited for)."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, job)
        if not timed:
            return await future
        try:
            return await asyncio.wait_for(future, self.settings.request_timeout_s)
        except TimeoutError:
            raise self.timed_out() from None

    async def translate(
        self, request: Request, units: list[str], pair: Pair = None, n_best: int = 1
    ) -> list[Any] | JSONResponse:
        """The translations of `units` in direction `pair` (n-best lists when `n_best` > 1),
        or the response to answer instead: 503 (full queue, dead batcher), 499 (the client
        went first).

        Raises:
            ApiError: 504 past ``request_timeout_s``; 500 when decoding fails.
            LitmtError: the user's mistake (400 via its handler).
        """
        try:
            if n_best == 1:
                out = await self._batched(request, units, pair)
            else:  # other options than the batch's: one job in the model's thread
                keywords = {**self.options, **self.direction(pair)}
                out = await self.run(
                    lambda: lt.nbest_units(self.translator, units, keywords, n_best)
                )
        except QueueFull:
            return self.unavailable("Server busy: too many requests are waiting; retry later")
        except BatcherDead:
            return self.unavailable("Server unavailable: the request batcher has stopped")
        except (LitmtError, ApiError):
            raise  # the user's mistake: 400 via its handler; a timeout: 504
        except Exception as exc:  # a failed batch: this request gets a 500, the server lives on
            log.exception("translation failed")
            raise ApiError(500, f"Cannot translate text: {exc}") from exc
        if out is None:  # nobody to answer; 499 is what proxies log for it
            return JSONResponse({"error": "Client closed the request"}, status_code=499)
        return out

    async def _batched(self, request: Request, units: list[str], pair: Pair) -> list[str] | None:
        """The batcher's translation of `units`; None when the client went first (its queued
        work is cancelled, so the batcher skips it)."""
        batcher = self.batcher if pair is None else self.batcher_for(pair)
        if batcher is None:
            raise BatcherDead("the request batcher was never started")
        work = asyncio.ensure_future(batcher.submit(units))
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            done, _ = await asyncio.wait(
                {work, gone},
                timeout=self.settings.request_timeout_s,
                return_when=FIRST_COMPLETED,
            )
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # a disconnect or the timeout: the batcher skips it
        if work in done:
            return work.result()
        if gone in done:
            return None
        raise self.timed_out()


async def _until_disconnect(request: Request) -> None:
    """Return when the client hangs up (the body is read: only a disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["Admission", "Pair"]
