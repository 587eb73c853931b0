"""The server's one way into the model: every decoding a request asks for is a job of
`litmt.deploy.server.model_queue.ModelQueue`, waited for here.

Plain translations, n-best lists (``alternatives``), steered requests (``prefix``,
``constraints``) and attention maps all meet the same bounded queue, the same admission
control, the same ``request_timeout_s`` and the same cancellation, and are counted in the same
``/health`` counters. Requests with the same direction, beam and n-best share batches.

A job's cost for the estimate (`litmt.deploy.server.model_queue.Job.cost`) is the sum over
its units of (source tokens + 1) times the beam it is searched with (a constrained sentence's
raised beam, `litmt.decoding.search.rules.constrained_beam`), so 8 units at the model's source
limit are priced far above 8 short lines.

What a request gets when it cannot be served, always ``{"error": ...}``:

- 503 with ``Retry-After``: the queue is full, the work queued ahead could not finish within
  ``request_timeout_s`` (refused at once, not queued to die), the job itself could not even
  alone, or the queue has stopped;
- 504: past ``request_timeout_s`` (its queued work is cancelled);
- 499 (logged; nobody reads it): the client hung up while it waited, and its queued work is
  cancelled, so the model never decodes it;
- 500: its decoding failed (the server lives on); the answer carries an error id only, the
  detail is logged under it (`litmt.deploy.server.errors.internal_error`).
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request

from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.rules import constrained_beam
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.errors import ApiError, internal_error
from litmt.deploy.server.model_queue import Job, ModelQueue, Overloaded, QueueFull, QueueStopped
from litmt.deploy.server.routes import libretranslate as lt
from litmt.errors import LitmtError

log = logging.getLogger(__name__)

Pair = tuple[str, str] | None  # a request's (source, target); None = a one-pair model


class Admission:
    """The model's one worker thread, its queue, and the answers of requests that wait.

    Args:
        translator: the `Translator` (torch or ct2) that decodes.
        settings: the server's settings (batching, queue, timeout, Retry-After).
        options: `Translator.translate` keywords of every translation (decoding options).
    """

    def __init__(self, translator: Any, settings: ServeConfig, options: dict[str, Any]) -> None:
        self.translator, self.settings, self.options = translator, settings, options
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litmt-model")
        self.queue = ModelQueue(
            self.executor,
            max_batch_sentences=settings.max_batch_sentences,
            max_wait_ms=settings.max_wait_ms,
            max_queue=settings.max_queue,
            stop_grain=settings.stop_grain_sentences,
            deadline_s=settings.request_timeout_s,
        )
        config = DecodeConfig.from_options(options)
        self.beam = config.beam_size if config.method == "beam" else 1  # every plain search's
        self.timed_out = 0  # 504s
        self.gone = 0  # clients that hung up while their work waited (499)
        self.failed = 0  # jobs whose decoding raised (500)

    def direction(self, pair: Pair) -> dict[str, Any]:
        """`Translator.translate` keywords of a direction ({} for a one-pair model)."""
        if pair is None:
            return {}
        return {
            "src_lang": pair[0],
            "tgt_lang": pair[1],
            "allow_zero_shot": self.settings.allow_zero_shot,
        }

    def start(self) -> None:
        """Start the queue's loop (the app's lifespan)."""
        self.queue.start()

    async def stop(self) -> None:
        """Stop the queue (its waiting requests fail) and the worker thread."""
        await self.queue.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    # -- costs ------------------------------------------------------------------------
    def source_tokens(self, units: list[str]) -> list[int]:
        """Source tokens of each unit (the translator's tokenizer; without one, about four
        characters a token)."""
        tokenizer = getattr(self.translator, "tokenizer", None)
        if tokenizer is not None and units:
            return [len(ids) for ids in tokenizer.encode_src(units)]
        return [len(unit) // 4 + 1 for unit in units]

    def cost(self, units: list[str], beams: list[int] | None = None) -> float:
        """A job's cost: per unit, (source tokens + 1) times its beam (`beams`, else the
        decoding's beam)."""
        beams = beams or [self.beam] * len(units)
        tokens = self.source_tokens(units)
        return float(sum((t + 1) * k for t, k in zip(tokens, beams, strict=True)))

    def steered_cost(self, units: list[str], constraint_ids: list[Any] | None) -> float:
        """The cost of a steered job: each constrained unit at its raised beam."""
        if not constraint_ids:
            return self.cost(units)
        return self.cost(units, [constrained_beam(self.beam, c or []) for c in constraint_ids])

    # -- the kinds of work -------------------------------------------------------------
    def translation_job(self, units: list[str], pair: Pair, n_best: int = 1) -> Job:
        """Plain translations (`n_best` = 1) or n-best lists of `units`; jobs of the same
        direction and n-best share batches."""
        keywords = {**self.options, **self.direction(pair)}
        cost = self.cost(units)
        if n_best == 1:
            return Job(
                lambda units: self.translator.translate(units, **keywords),
                units,
                key=("translate", pair),
                cost=cost,
            )
        return Job(
            lambda units: lt.nbest_units(self.translator, units, keywords, n_best),
            units,
            key=("nbest", pair, n_best),
            kind="nbest",
            cost=cost,
        )

    def call_job(
        self, fn: Callable[[], Any], kind: str, size: int = 1, cost: float | None = None
    ) -> Job:
        """`fn()` as a job of its own (steered requests, attention maps); `size`: its items;
        `cost`: its cost for the service-time estimate (None: `size`)."""
        return Job(lambda _items: [fn()], [None] * size, key=None, kind=kind, cost=cost)

    async def translate(
        self, request: Request, units: list[str], pair: Pair = None, n_best: int = 1
    ) -> list[Any]:
        """The translations of `units` in direction `pair` (n-best lists when `n_best` > 1)."""
        return await self.wait(request, self.translation_job(units, pair, n_best))

    async def call(
        self,
        request: Request,
        fn: Callable[[], Any],
        kind: str,
        size: int = 1,
        cost: float | None = None,
    ) -> Any:
        """`fn()`'s result, run in the model's thread as a job of its own."""
        out = await self.wait(request, self.call_job(fn, kind, size, cost), what=kind)
        return out[0]

    # -- waiting -----------------------------------------------------------------------
    async def wait(self, request: Request, job: Job, what: str = "translation") -> list[Any]:
        """`job`'s results, once its batch has run.

        Raises:
            ApiError: 503 (refused), 504 (timed out), 499 (the client went), 500 (the
                decoding failed).
            LitmtError: the user's mistake, found by the decoding (400 via its handler).
        """
        try:
            future = self.queue.submit(job)
        except QueueFull:
            raise self._busy("Server busy: too many requests are waiting; retry later") from None
        except Overloaded as exc:
            if exc.alone:
                raise self._busy(
                    f"Server busy: this request would take about {exc.wait_s:.1f} s, over "
                    f"request_timeout_s={self.settings.request_timeout_s:g} s; send less at once"
                ) from exc
            raise self._busy(
                f"Server busy: the requests queued ahead would not finish within "
                f"request_timeout_s={self.settings.request_timeout_s:g} s; retry later"
            ) from exc
        except QueueStopped:
            raise self._busy("Server unavailable: the model queue has stopped") from None
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            done, _ = await asyncio.wait(
                {future, gone}, timeout=self.settings.request_timeout_s, return_when=FIRST_COMPLETED
            )
        finally:
            gone.cancel()
            if not future.done():
                future.cancel()  # a disconnect or the timeout: the queue skips it
        if future in done:
            return self._result(future, what)
        if gone in done:
            self.gone += 1
            raise ApiError(499, "Client closed the request")
        self.timed_out += 1
        raise ApiError(
            504, f"Translation timed out (request_timeout_s={self.settings.request_timeout_s:g})"
        )

    def _result(self, future: asyncio.Future, what: str) -> list[Any]:
        """The job's results, or the error its client gets."""
        try:
            return future.result()
        except QueueStopped:
            raise self._busy("Server unavailable: the server is stopping") from None
        except (LitmtError, ApiError):
            raise  # the user's mistake: 400 via its handler
        except Exception as exc:  # a failed batch: this request gets a 500, the server lives on
            self.failed += 1  # the client gets an error id, the log the detail under it
            raise internal_error(f"{what} failed", exc) from exc

    def _busy(self, message: str) -> ApiError:
        """503 with ``Retry-After``."""
        return ApiError(503, message, headers={"Retry-After": str(self.settings.retry_after_s)})

    def counters(self) -> dict[str, Any]:
        """``/health``'s view of the queue."""
        q = self.queue
        return {
            "queued": q.queued,
            "batches": q.batches,
            "largest_batch": q.largest_batch,
            "skipped": q.skipped,  # jobs dropped before decoding: their client went
            "stopped": q.stopped,  # batches stopped mid-decode: every client had gone
            "rejected": q.rejected,  # 503: the queue was full
            "shed": q.shed,  # 503: could not finish within request_timeout_s
            "timed_out": self.timed_out,  # 504
            "failed": self.failed,  # 500
            "backlog_s": round(q.backlog_s(), 3),
            # per (source token + 1) x beam of each kind of work
            "ms_per_token": {k: round(1000 * v, 4) for k, v in q.times.per_unit.items()},
        }


async def _until_disconnect(request: Request) -> None:
    """Return when the client hangs up (the body is read: only a disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["Admission", "Pair"]
