"""Request batching for the server: concurrent HTTP requests share one model call.

The first request of a batch waits at most ``max_wait_ms`` for others, until the batch holds
``max_batch_sentences`` sentences; the batch then runs in a one-thread executor, so the model
is never called twice at once. A request larger than ``max_batch_sentences`` is a batch of its
own; a newcomer that would overflow a batch starts the next one. A failing batch fails its own
requests only: its requests are retried one by one, and only those that fail again get the
exception.

The queue holds at most ``max_queue`` waiting requests (`QueueFull` past that, for the server
to answer 503). A request whose future was cancelled before its batch ran (its client went
or timed out) is skipped and counted in `skipped`. Every future is settled only while it is
still pending, and an unexpected error in one batch fails that batch's requests, never the
loop: the batcher dies only when cancelled (`alive` says whether it runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The batcher's queue holds `max_queue` requests already."""


class BatcherDead(Exception):
    """The batcher's task has ended: no request can be answered."""


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future


def _settle(future: asyncio.Future, *, result: object = None, exc: BaseException | None = None):
    """Set `future`'s result or exception unless it is done already (cancelled by its waiter)."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class RequestBatcher:
    """Collect concurrent requests into batches for one worker thread.

    Args:
        fn: translates a list of sentences (runs in `executor`, one batch at a time).
        executor: a one-thread executor (shared with anything else that uses the model).
        max_batch_sentences: most sentences per batch (a larger single request is one batch).
        max_wait_ms: how long the first request of a batch waits for others.
        max_queue: most requests waiting for a batch (0 = unbounded).
    """

    def __init__(
        self,
        fn: Callable[[list[str]], list[str]],
        executor: ThreadPoolExecutor,
        *,
        max_batch_sentences: int,
        max_wait_ms: float,
        max_queue: int = 0,
    ) -> None:
        self.fn, self.executor = fn, executor
        self.max_batch_sentences, self.max_wait = max_batch_sentences, max_wait_ms / 1000.0
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max_queue)
        self.batches = 0  # batches run so far
        self.largest_batch = 0  # most requests merged into one batch
        self.skipped = 0  # requests dropped before decoding: their waiter had gone
        self.rejected = 0  # requests refused because the queue was full
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        """Whether the batching task runs (False before `start` and after it ended)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        while not self.queue.empty():  # nobody will run these any more
            _settle(self.queue.get_nowait().future, exc=BatcherDead("the server is stopping"))

    async def submit(self, texts: list[str]) -> list[str]:
        """Translate `texts` as part of the next batch.

        Raises:
            QueueFull: `max_queue` requests wait already.
            BatcherDead: the batching task has ended.
        """
        if not self.alive:
            raise BatcherDead("the request batcher is not running")
        future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(_Pending(texts, future))
        except asyncio.QueueFull:
            self.rejected += 1
            raise QueueFull(f"{self.queue.maxsize} requests are waiting already") from None
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch, ready = [await self.queue.get()], []
            try:
                size = len(batch[0].texts)
                deadline = loop.time() + self.max_wait
                while size < self.max_batch_sentences:
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
                    if size + len(item.texts) > self.max_batch_sentences:
                        ready, batch = batch, []
                        await self._process(loop, ready)  # the newcomer starts the next batch
                        size, deadline = 0, loop.time() + self.max_wait
                    batch.append(item)
                    size += len(item.texts)
                ready, batch = batch, []
                await self._process(loop, ready)
            except Exception as exc:  # a bug in one batch fails its requests, not the loop
                log.exception("the request batcher failed on a batch; it goes on")
                for p in ready + batch:
                    _settle(p.future, exc=exc)

    async def _process(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]  # a client may have gone
        self.skipped += len(batch) - len(live)
        if not live:
            return
        texts = [t for p in live for t in p.texts]
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(live))
        try:
            out = await loop.run_in_executor(self.executor, self.fn, texts)
        except Exception as exc:  # handed to the waiting request(s), which report it
            if len(live) == 1:
                _settle(live[0].future, exc=exc)  # its client may have gone meanwhile
                return
            log.warning(
                "a batch of %d requests failed (%s); retrying them one by one", len(live), exc
            )
            for p in live:  # so that only the request that fails gets the error
                await self._process(loop, [p])
            return
        start = 0
        for p in live:
            _settle(p.future, result=out[start : start + len(p.texts)])
            start += len(p.texts)


__all__ = ["BatcherDead", "QueueFull", "RequestBatcher"]
