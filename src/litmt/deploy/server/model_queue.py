"""The model's one queue: every decoding the server does waits here, bounded, batched where it
can be, and refused at once when it could not finish in time.

A `Job` is a list of items (sentences, or one attention request) and the function that
decodes a list of items in the model's one thread. Jobs with the same `Job.key` (the same
direction, beam and n-best) share a batch: the first job of a batch waits at most
``max_wait_ms`` for company, until the batch holds ``max_batch_sentences`` items; a job with
``key=None`` (steered requests, attention maps) runs alone. A job larger than the batch runs
alone; a newcomer that would overflow a batch starts the next one. Jobs of other keys that
wait end the wait for company at once, so a lone job never holds up other work.

Admission (`ModelQueue.submit`):

- at most ``max_queue`` jobs wait (`QueueFull` past that);
- a job whose estimated finish lies past ``deadline_s`` is refused at once (`Overloaded`):
  the estimate is the work queued ahead of it plus its own, each job's `Job.cost` (its
  source tokens times its beam, as the server prices it; else its number of items) times the
  measured seconds per unit of cost of its kind (`ServiceTimes`: an average over recent
  batches, so under load it is the cost in the full batches that load makes). A job with
  nothing ahead is admitted unless its own cost at the best rate its kind has run at (after
  two timed batches, `ServiceTimes.alone_s`) lies past ``deadline_s`` (``Overloaded.alone``). Work that would only time out in the queue
  is never queued, so the model spends its time on requests that can still be answered;
- a job whose future is cancelled before its batch runs (its client went, or timed out) is
  skipped and counted in `skipped`.

A failing batch fails its own jobs only: they are retried one by one, and only those that
fail again get the exception. An unexpected error in one batch fails that batch's jobs,
never the loop: the loop ends only when cancelled (`alive` says whether it runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from litmt.decoding.search.stopping import DEFAULT_GRAIN, DecodeStopped, stop_when

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """``max_queue`` jobs wait already."""


class QueueStopped(Exception):
    """The queue's loop has ended: no job can be answered."""


class Overloaded(Exception):
    """The job could not finish within the deadline: `wait_s` is the estimate; `alone`: it
    could not even with nothing ahead of it."""

    def __init__(self, wait_s: float, deadline_s: float, alone: bool = False) -> None:
        what = "the job alone" if alone else "the work queued ahead"
        super().__init__(f"{what} would take about {wait_s:.1f} s (deadline {deadline_s:g} s)")
        self.wait_s, self.alone = wait_s, alone


@dataclass(eq=False)
class Job:
    """Items to decode and the function that decodes a list of them (one result per item).

    Args:
        run: decodes a list of items in the model's thread; returns one result per item.
        items: the job's items (its size is their number).
        key: jobs with equal keys may share a batch (their `run` must be interchangeable);
            None: the job runs alone.
        kind: its kind of work, for the service-time estimate and ``/health``
            ("translate", "nbest", "steered", "attention").
        cost: its work for the estimate, in the units its kind is measured in (the server:
            source tokens times beam); None = its number of items.
    """

    run: Callable[[list[Any]], list[Any]]
    items: list[Any]
    key: Hashable | None = None
    kind: str = "translate"
    cost: float | None = None
    future: asyncio.Future = field(init=False, repr=False)

    @property
    def size(self) -> int:
        return max(1, len(self.items))

    @property
    def work(self) -> float:
        """Its cost for the estimate (`cost`, else its size)."""
        return float(self.size) if self.cost is None else max(1.0, float(self.cost))


class ServiceTimes:
    """Seconds per unit of cost (`Job.work`: source tokens times beam, or items) of each kind
    of work: an exponential moving average over batches.

    Args:
        alpha: weight of the newest batch.
    """

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.per_unit: dict[str, float] = {}
        self.best: dict[str, float] = {}  # the lowest rate any batch of the kind ran at
        self.batches: dict[str, int] = {}

    def record(self, kind: str, seconds: float, work: float) -> None:
        """A batch of `kind` with `work` units of cost took `seconds`."""
        rate = seconds / max(1.0, work)
        old = self.per_unit.get(kind)
        self.per_unit[kind] = rate if old is None else old + self.alpha * (rate - old)
        self.best[kind] = min(rate, self.best.get(kind, rate))
        self.batches[kind] = self.batches.get(kind, 0) + 1

    def alone_s(self, kind: str, work: float) -> float | None:
        """Seconds `work` units of `kind` take at the best rate its batches have run at;
        None before two batches of the kind have been timed (the first may be a warm-up).
        Optimistic on purpose: a job is refused alone only when even that lies past the
        deadline, so one slow batch never locks a kind out."""
        if self.batches.get(kind, 0) < 2:
            return None
        return self.best[kind] * work

    def estimate(self, kind: str, work: float) -> float:
        """Seconds `work` units of `kind` take (a kind never measured: the slowest kind's
        rate; nothing measured yet: 0, so the first requests are never refused on a guess)."""
        rate = self.per_unit.get(kind)
        if rate is None:
            rate = max(self.per_unit.values(), default=0.0)
        return rate * work


def _settle(future: asyncio.Future, *, result: object = None, exc: BaseException | None = None):
    """Set `future`'s result or exception unless it is done already (cancelled by its waiter)."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class ModelQueue:
    """One bounded queue of jobs for the model's one worker thread.

    Args:
        executor: a one-thread executor, the only place the model runs.
        max_batch_sentences: most items per batch (a larger job is a batch of its own).
        max_wait_ms: how long the first job of a batch waits for company.
        max_queue: most jobs waiting.
        deadline_s: refuse a job whose estimated finish lies further ahead (None: never).
        stop_grain: sentences per sub-batch of an engine that can stop only between
            sub-batches (`litmt.decoding.search.stopping.stop_when`).
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        *,
        max_batch_sentences: int,
        max_wait_ms: float,
        max_queue: int,
        deadline_s: float | None = None,
        stop_grain: int = DEFAULT_GRAIN,
    ) -> None:
        self.executor = executor
        self.stop_grain = stop_grain
        self.max_batch_sentences, self.max_wait = max_batch_sentences, max_wait_ms / 1000.0
        self.max_queue, self.deadline_s = max_queue, deadline_s
        self.pending: deque[Job] = deque()
        self.times = ServiceTimes()
        self.batches = 0  # batches run so far
        self.largest_batch = 0  # most jobs merged into one batch
        self.skipped = 0  # jobs dropped before decoding: their waiter had gone
        self.rejected = 0  # jobs refused because the queue was full
        self.shed = 0  # jobs refused because they could not finish before the deadline
        self.stopped = 0  # batches stopped mid-decode: every client of the batch had gone
        self._busy_until = 0.0  # monotonic estimate of the running batch's end
        self._running_since: float | None = None  # monotonic start of the batch on the thread
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def job_age_s(self) -> float:
        """How long the model thread has been on its current batch (0.0 when idle)."""
        since = self._running_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def alive(self) -> bool:
        """Whether the loop runs (False before `start` and after it ended)."""
        return self._task is not None and not self._task.done()

    @property
    def queued(self) -> int:
        """Jobs waiting whose client still waits."""
        return sum(1 for job in self.pending if not job.future.done())

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        while self.pending:  # nobody will run these any more
            _settle(self.pending.popleft().future, exc=QueueStopped("the server is stopping"))

    def backlog_s(self) -> float:
        """Estimated seconds until the work queued now (and the running batch) is done."""
        ahead = sum(
            self.times.estimate(job.kind, job.work) for job in self.pending if not job.future.done()
        )
        return ahead + max(0.0, self._busy_until - time.monotonic())

    def submit(self, job: Job) -> asyncio.Future:
        """Queue `job`; its future gets the results (one per item).

        Raises:
            QueueStopped: the loop has ended.
            QueueFull: ``max_queue`` jobs wait already.
            Overloaded: the job could not finish within ``deadline_s`` (queued work ahead of
                it and its own; or its own alone, once its kind has been measured).
        """
        if not self.alive:
            raise QueueStopped("the model queue is not running")
        self._purge()
        if len(self.pending) >= self.max_queue:
            self.rejected += 1
            raise QueueFull(f"{self.max_queue} requests are waiting already")
        if self.deadline_s is not None:
            alone = self.times.alone_s(job.kind, job.work)
            if alone is not None and alone > self.deadline_s:
                self.shed += 1  # it would time out even alone, at the best rate seen
                raise Overloaded(alone, self.deadline_s, alone=True)
            own = self.times.estimate(job.kind, job.work)
            ahead = self.backlog_s()  # with nothing ahead a job gets its chance otherwise
            if ahead > 0 and ahead + own > self.deadline_s:
                self.shed += 1
                raise Overloaded(ahead + own, self.deadline_s)
        job.future = asyncio.get_running_loop().create_future()
        self.pending.append(job)
        assert self._arrived is not None
        self._arrived.set()
        return job.future

    def _purge(self) -> None:
        """Drop (and count) the waiting jobs whose waiter has gone."""
        if any(job.future.done() for job in self.pending):
            live = deque(job for job in self.pending if not job.future.done())
            self.skipped += len(self.pending) - len(live)
            self.pending = live

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._next()]
            try:
                if batch[0].key is not None:
                    await self._fill(loop, batch)
                await self._process(loop, batch)
            except Exception as exc:  # a bug in one batch fails its jobs, not the loop
                log.exception("the model queue failed on a batch; it goes on")
                for job in batch:
                    _settle(job.future, exc=exc)

    async def _next(self) -> Job:
        """The oldest job whose client still waits (waits for one)."""
        assert self._arrived is not None
        while True:
            while self.pending:
                job = self.pending.popleft()
                if not job.future.done():
                    return job
                self.skipped += 1
            self._arrived.clear()
            await self._arrived.wait()

    def _take(self, key: Hashable, room: int) -> Job | bool | None:
        """The first waiting job of `key` that fits in `room` items (removed from the queue);
        False when the batch should run now (the next job of `key` would overflow it, or
        other work waits); None when nothing waits."""
        self._purge()
        for i, job in enumerate(self.pending):
            if job.key == key:
                if job.size > room:
                    return False  # it starts the next batch
                del self.pending[i]
                return job
        return False if self.pending else None

    async def _fill(self, loop: asyncio.AbstractEventLoop, batch: list[Job]) -> None:
        """Add jobs of the batch's key until it is full, other work waits, or the first job
        has waited ``max_wait_ms``."""
        assert self._arrived is not None
        size, deadline = batch[0].size, loop.time() + self.max_wait
        while size < self.max_batch_sentences:
            found = self._take(batch[0].key, self.max_batch_sentences - size)
            if found is False:
                return
            if isinstance(found, Job):
                batch.append(found)
                size += found.size
                continue
            timeout = deadline - loop.time()
            if timeout <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except TimeoutError:
                return

    async def _process(self, loop: asyncio.AbstractEventLoop, batch: list[Job]) -> None:
        live = [job for job in batch if not job.future.done()]  # a client may have gone
        self.skipped += len(batch) - len(live)
        if not live:
            return
        items = [item for job in live for item in job.items]
        kind, work = live[0].kind, sum(job.work for job in live)
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(live))
        start = time.monotonic()
        self._busy_until = start + self.times.estimate(kind, work)
        self._running_since = start
        try:
            out = await loop.run_in_executor(
                self.executor, _stoppable(live, self.stop_grain), items
            )
        except DecodeStopped as exc:  # every client of the batch went or timed out meanwhile
            self.stopped += 1
            log.info("a batch of %d job(s) was stopped: %s", len(live), exc)
            return
        except Exception as exc:  # handed to the waiting request(s), which report it
            if len(live) == 1:
                _settle(live[0].future, exc=exc)  # its client may have gone meanwhile
                return
            log.warning("a batch of %d jobs failed (%s); retrying them one by one", len(live), exc)
            for job in live:  # so that only the job that fails gets the error
                await self._process(loop, [job])
            return
        finally:
            self._busy_until = 0.0
            self._running_since = None
        self.times.record(kind, time.monotonic() - start, work)
        start_at = 0
        for job in live:
            _settle(job.future, result=out[start_at : start_at + len(job.items)])
            start_at += len(job.items)


def _stoppable(jobs: list[Job], grain: int = DEFAULT_GRAIN) -> Callable[[list[Any]], list[Any]]:
    """The batch's `run` under `stop_when`: once every job's future is done (its client went,
    or its request timed out: the waiter cancels it), the search stops at its next step
    (`litmt.decoding.search.stopping`; an engine with its own search, CTranslate2, at its
    next sub-batch of at most `grain` sentences). The futures' callbacks run on the event
    loop and set a thread-safe event the model thread reads."""
    gone = threading.Event()

    def on_done(_future: asyncio.Future) -> None:
        if all(job.future.done() for job in jobs):
            gone.set()

    for job in jobs:
        job.future.add_done_callback(on_done)
    run = jobs[0].run

    def run_stoppable(items: list[Any]) -> list[Any]:
        with stop_when(gone.is_set, grain):
            return run(items)

    return run_stoppable


__all__ = ["Job", "ModelQueue", "Overloaded", "QueueFull", "QueueStopped", "ServiceTimes"]
