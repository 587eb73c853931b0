"""Request batching for the server: concurrent HTTP requests share one model call.

The first request of a batch waits at most ``max_wait_ms`` for others, until the batch holds
``max_batch`` sentences; the batch then runs in a one-thread executor, so the model is never
called twice at once. A request larger than ``max_batch`` is a batch of its own; a newcomer
that would overflow a batch starts the next one. A failing batch fails its own requests
only: its requests are retried one by one, and only those that fail again get the exception.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future


class RequestBatcher:
    """Collect concurrent requests into batches for one worker thread.

    Args:
        fn: translates a list of sentences (runs in `executor`, one batch at a time).
        executor: a one-thread executor (shared with anything else that uses the model).
        max_batch: most sentences per batch (a larger single request is one batch).
        max_wait_ms: how long the first request of a batch waits for others.
    """

    def __init__(
        self,
        fn: Callable[[list[str]], list[str]],
        executor: ThreadPoolExecutor,
        *,
        max_batch: int,
        max_wait_ms: float,
    ) -> None:
        self.fn, self.executor = fn, executor
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000.0
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.batches = 0  # batches run so far
        self.largest_batch = 0  # most requests merged into one batch
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, texts: list[str]) -> list[str]:
        """Translate `texts` as part of the next batch."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(texts, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            size = len(batch[0].texts)
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                timeout = deadline - loop.time()
                if not self.queue.empty():
                    item = self.queue.get_nowait()
                elif timeout <= 0:
                    break
                else:
                    try:
                        item = await asyncio.wait_for(self.queue.get(), timeout)
                    except asyncio.TimeoutError:
                        break
                if size + len(item.texts) > self.max_batch:
                    await self._process(loop, batch)  # the newcomer starts the next batch
                    batch, size, deadline = [], 0, loop.time() + self.max_wait
                batch.append(item)
                size += len(item.texts)
            await self._process(loop, batch)

    async def _process(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]  # a client may have gone
        if not live:
            return
        texts = [t for p in live for t in p.texts]
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(live))
        try:
            out = await loop.run_in_executor(self.executor, self.fn, texts)
        except Exception as exc:  # handed to the waiting request(s), which report it
            if len(live) == 1:
                if not live[0].future.done():  # its client may have gone meanwhile
                    live[0].future.set_exception(exc)
                return
            log.warning(
                "a batch of %d requests failed (%s); retrying them one by one", len(live), exc
            )
            for p in live:  # so that only the request that fails gets the error
                await self._process(loop, [p])
            return
        start = 0
        for p in live:
            if not p.future.done():
                p.future.set_result(out[start : start + len(p.texts)])
            start += len(p.texts)


__all__ = ["RequestBatcher"]
