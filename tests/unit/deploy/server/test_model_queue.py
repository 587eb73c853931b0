"""ModelQueue: batching by key, one bound for every kind of job, refusal before work that
could not finish in time, and skipping work whose client went."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from litmt.deploy.server.admission import Admission
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.model_queue import Job, ModelQueue, Overloaded, QueueFull, ServiceTimes


def _gated():
    """A decode function that blocks until `gate` is set; `calls` records its batches."""
    gate, entered, calls = threading.Event(), threading.Event(), []

    def fn(items: list[str]) -> list[str]:
        calls.append(list(items))
        entered.set()
        assert gate.wait(10), "the test never opened the gate"
        return [str(i).upper() for i in items]

    return fn, gate, entered, calls


async def _occupy(q: ModelQueue, fn, entered: threading.Event, item: str = "busy"):
    """Submit `item` and return its future once the model's thread is decoding it."""
    busy = q.submit(Job(fn, [item], key="t"))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
    return busy


def _run(main):
    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(main(pool))


def test_jobs_of_one_key_share_a_batch_and_other_keys_run_apart():
    fn, gate, _entered, calls = _gated()
    gate.set()

    async def main(pool):
        q = ModelQueue(pool, max_batch_sentences=8, max_wait_ms=200, max_queue=16)
        q.start()
        try:
            futures = [
                q.submit(Job(fn, ["a"], key=("nbest", None, 3), kind="nbest")),
                q.submit(Job(fn, ["b"], key=("translate", None), kind="translate")),
                q.submit(Job(fn, ["c", "d"], key=("nbest", None, 3), kind="nbest")),
                q.submit(Job(fn, ["e"], key=None, kind="attention")),  # alone
                q.submit(Job(fn, ["f"], key=("translate", None), kind="translate")),
            ]
            return await asyncio.gather(*futures), q
        finally:
            await q.stop()

    results, q = _run(main)
    assert results == [["A"], ["B"], ["C", "D"], ["E"], ["F"]]
    assert calls == [["a", "c", "d"], ["b", "f"], ["e"]]
    assert (q.batches, q.largest_batch) == (3, 2)
    assert set(q.times.per_unit) == {"nbest", "translate", "attention"}


def test_every_kind_meets_the_one_bound():
    fn, gate, entered, _calls = _gated()

    async def main(pool):
        q = ModelQueue(pool, max_batch_sentences=1, max_wait_ms=0, max_queue=2)
        q.start()
        try:
            busy = await _occupy(q, fn, entered)
            waiting = [q.submit(Job(fn, ["x"], key=None, kind="attention"))]
            waiting.append(q.submit(Job(fn, ["y"], key=("nbest", 3), kind="nbest")))
            refused = []
            for kind, key in (("translate", "t"), ("steered", None), ("attention", None)):
                with pytest.raises(QueueFull, match="2 requests are waiting already"):
                    q.submit(Job(fn, ["z"], key=key, kind=kind))
                refused.append(kind)
            gate.set()
            return await asyncio.gather(busy, *waiting), refused, q.rejected
        finally:
            gate.set()
            await q.stop()

    results, refused, rejected = _run(main)
    assert results == [["BUSY"], ["X"], ["Y"]]
    assert rejected == 3 and refused == ["translate", "steered", "attention"]


def test_work_that_could_not_finish_before_the_deadline_is_refused_at_once():
    fn, gate, entered, _calls = _gated()

    async def main(pool):
        q = ModelQueue(pool, max_batch_sentences=1, max_wait_ms=0, max_queue=100, deadline_s=2.5)
        q.times.per_unit["translate"] = 1.0  # as if measured: one second per sentence
        q.start()
        try:
            first = await _occupy(q, fn, entered, "one")  # nothing ahead: admitted
            queued = [q.submit(Job(fn, ["two"], key="t"))]  # ~1 s running + 1 s own: 2 s
            with pytest.raises(Overloaded, match=r"about 3\.\d s \(deadline 2\.5 s\)"):
                q.submit(Job(fn, ["three"], key="t"))  # 1 + 1 + 1 s > 2.5 s
            with pytest.raises(Overloaded):  # the estimate counts every kind
                q.submit(Job(fn, ["a"], key=None, kind="attention"))
            gate.set()
            return await asyncio.gather(first, *queued), q.shed
        finally:
            gate.set()
            await q.stop()

    results, shed = _run(main)
    assert results == [["ONE"], ["TWO"]] and shed == 2


def test_a_job_alone_is_admitted_unless_its_own_measured_estimate_is_past_the_deadline():
    async def main(pool):
        q = ModelQueue(pool, max_batch_sentences=4, max_wait_ms=0, max_queue=4, deadline_s=1.0)
        q.times.record("translate", 5.0, 100)  # a slow first batch (a warm-up): 50 ms
        assert q.times.alone_s("translate", 200) is None  # one batch: never refused alone
        q.times.record("translate", 1.0, 100)  # 10 ms per token x beam: the best rate
        q.start()
        try:
            with pytest.raises(Overloaded, match=r"the job alone would take about 2\.0 s") as e:
                q.submit(Job(lambda items: items, ["x", "y"], key="t", cost=200))
            assert e.value.alone and q.shed == 1
            small = await q.submit(Job(lambda items: items, ["x", "y"], key="t", cost=50))
            # a kind not measured is priced at the slowest rate, but never refused alone
            unmeasured = await q.submit(Job(lambda items: items, ["z"], kind="attention", cost=500))
            return small, unmeasured
        finally:
            await q.stop()

    assert _run(main) == (["x", "y"], ["z"])


class _Tokenizer:
    """One source token per word."""

    def encode_src(self, units):
        return [[1] * len(u.split()) for u in units]


class _Translator:
    tokenizer = _Tokenizer()


def test_a_job_is_priced_by_its_source_tokens_and_beam():
    admission = Admission(_Translator(), ServeConfig(), {"beam_size": 4})
    try:
        long = admission.translation_job([" ".join(["w"] * 250)] * 8, None)
        short = admission.translation_job(["a short line"] * 8, None)
        assert long.size == short.size == 8
        assert long.work == 8 * 251 * 4 and short.work == 8 * 4 * 4
        times = ServiceTimes()
        times.record("translate", 1.0, short.work + long.work)  # one measured batch
        assert times.estimate("translate", long.work) > 50 * times.estimate("translate", short.work)
        # a constrained sentence is priced at its raised beam: constraint pieces + 1
        steered = admission.steered_cost(["a short line"], [[[5, 6, 7], [8] * 10]])
        assert steered == 4 * (13 + 1) and admission.steered_cost(["a b"], None) == 3 * 4
    finally:
        admission.executor.shutdown()


def test_jobs_whose_client_went_are_skipped_and_free_their_place():
    fn, gate, entered, calls = _gated()

    async def main(pool):
        q = ModelQueue(pool, max_batch_sentences=1, max_wait_ms=0, max_queue=2)
        q.start()
        try:
            busy = await _occupy(q, fn, entered)
            gone = [q.submit(Job(fn, [f"gone{i}"], key="t")) for i in range(2)]
            for future in gone:
                future.cancel()  # their clients hung up
            after = q.submit(Job(fn, ["after"], key="t"))  # their places are free again
            gate.set()
            return await asyncio.gather(busy, after), q.skipped
        finally:
            gate.set()
            await q.stop()

    results, skipped = _run(main)
    assert results == [["BUSY"], ["AFTER"]] and skipped == 2
    assert calls == [["busy"], ["after"]]  # nothing was decoded for the two that went


def test_service_times_average_per_item_and_guess_an_unmeasured_kind_high():
    times = ServiceTimes(alpha=0.5)
    assert times.estimate("translate", 10) == 0.0  # nothing measured: never refuse on a guess
    times.record("translate", 1.0, 10)  # 0.1 s per item
    times.record("translate", 3.0, 10)  # 0.3 -> average 0.2
    times.record("attention", 2.0, 1)
    assert times.estimate("translate", 5) == pytest.approx(1.0)
    assert times.estimate("nbest", 1) == pytest.approx(2.0)  # the slowest kind's rate
