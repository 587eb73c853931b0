"""A batch whose every client has gone or timed out stops decoding at its next step (issue 55:
"a job whose client has gone or timed out stops decoding at the next step"), and frees the
model thread for the next job; a batch with one client still waiting runs to its end."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from litmt.decoding.search.stopping import check_stop
from litmt.deploy.server.model_queue import Job, ModelQueue

STEP_S = 0.01


def slow_decode(steps: int, log: list[str]):
    """A decode of `steps` steps of STEP_S each, checking for a stop at each step as the
    search loops do; records how it ended."""

    def run(items: list[str]) -> list[str]:
        for step in range(steps):
            try:
                check_stop(step)
            except BaseException:
                log.append(f"stopped at {step}")
                raise
            time.sleep(STEP_S)
        log.append("finished")
        return [i.upper() for i in items]

    return run


def test_a_batch_whose_clients_all_went_stops_and_frees_the_thread() -> None:
    log: list[str] = []

    async def main(pool: ThreadPoolExecutor) -> tuple[ModelQueue, float]:
        q = ModelQueue(pool, max_batch_sentences=8, max_wait_ms=0, max_queue=8)
        q.start()
        try:
            long = q.submit(Job(slow_decode(2000, log), ["a"], key="t"))  # 20 s alone
            await asyncio.sleep(0.3)
            long.cancel()  # the client went (what Admission.wait does on a disconnect)
            t0 = time.monotonic()
            nxt = await asyncio.wait_for(q.submit(Job(slow_decode(1, log), ["b"], key="u")), 5)
            assert nxt == ["B"]
            return q, time.monotonic() - t0
        finally:
            await q.stop()

    with ThreadPoolExecutor(1) as pool:
        q, waited = asyncio.run(main(pool))
    assert q.stopped == 1 and log[0].startswith("stopped at ") and log[1] == "finished"
    assert int(log[0].split()[-1]) < 200  # within a few steps of the cancel, not 2000
    assert waited < 2.0  # the next job did not wait for the 20 s decode


def test_a_batch_with_one_client_still_waiting_runs_to_its_end() -> None:
    log: list[str] = []

    async def main(pool: ThreadPoolExecutor) -> tuple[ModelQueue, list[str]]:
        q = ModelQueue(pool, max_batch_sentences=8, max_wait_ms=200, max_queue=8)
        q.start()
        try:
            run = slow_decode(40, log)
            first = q.submit(Job(run, ["a"], key="t"))
            second = q.submit(Job(run, ["b"], key="t"))  # the same batch
            await asyncio.sleep(0.3)
            first.cancel()
            return q, await asyncio.wait_for(second, 5)
        finally:
            await q.stop()

    with ThreadPoolExecutor(1) as pool:
        q, out = asyncio.run(main(pool))
    assert out == ["B"] and log == ["finished"] and q.stopped == 0
