"""Two behaviours of the server's batching that no test pinned (issue 58's finding on issue 55):
a job cancelled while its batch waits for company is never decoded, and n-best jobs never
share a batch with plain translations (`Admission.translation_job`'s keys)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from litmt.deploy.server.admission import Admission
from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.model_queue import Job, ModelQueue


def _recorder():
    """A decode function that records each batch it is given."""
    calls: list[list[str]] = []

    def fn(items: list[str]) -> list[str]:
        calls.append(list(items))
        return [str(i).upper() for i in items]

    return fn, calls


def _run(main):
    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(main(pool))


def test_a_job_cancelled_while_its_batch_waits_for_company_is_not_decoded():
    fn, calls = _recorder()

    async def main(pool) -> ModelQueue:
        q = ModelQueue(pool, max_batch_sentences=8, max_wait_ms=400, max_queue=8)
        q.start()
        try:
            head = q.submit(Job(fn, ["gone"], key="t"))
            await asyncio.sleep(0.1)  # the loop took it as a batch's first job and waits
            assert not q.pending and not calls
            head.cancel()  # its client went while the batch waited
            kept = q.submit(Job(fn, ["kept"], key="t"))  # joins the same batch
            assert await asyncio.wait_for(kept, 5) == ["KEPT"]
        finally:
            await q.stop()
        return q

    q = _run(main)
    assert calls == [["kept"]]  # "gone" was never decoded
    assert q.skipped == 1


class _Translator:
    src_lang, tgt_lang = "en", "de"

    def translate(self, texts: list[str], **options) -> list[str]:
        return list(texts)


def test_n_best_jobs_never_share_a_batch_with_plain_ones():
    admission = Admission(_Translator(), ServeConfig(max_wait_ms=400), {})
    try:
        jobs = [
            admission.translation_job(["a"], None),
            admission.translation_job(["b"], None, n_best=3),
            admission.translation_job(["c"], None),
        ]
    finally:
        admission.executor.shutdown(wait=False)
    assert jobs[0].key == jobs[2].key != jobs[1].key
    fn, calls = _recorder()

    async def main(pool) -> None:
        q = ModelQueue(pool, max_batch_sentences=8, max_wait_ms=400, max_queue=8)
        q.start()
        try:  # the same keys and kinds, a recording decode function
            futures = [q.submit(Job(fn, job.items, key=job.key, kind=job.kind)) for job in jobs]
            await asyncio.wait_for(asyncio.gather(*futures), 5)
        finally:
            await q.stop()

    _run(main)
    assert sorted(calls) == [["a", "c"], ["b"]]  # plain together, the n-best apart
