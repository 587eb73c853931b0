"""The ct2 engine stops an abandoned decode between sub-batches (issue 55: "a job whose client
has gone or timed out stops decoding"): under `stop_when` it decodes in CTranslate2's own
groups of at most `grain` sentences, gives the same translations as a whole call, checks
before each submission, and outside `stop_when` submits every call whole as before.

The engine runs the committed legacy fixture (a checkpoint and its CTranslate2 export).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from parity import assert_parity
from tiny_checkpoint import corpus

from litmt.decoding.search.stopping import DecodeStopped, stop_when
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator, ct2_batches
from litmt.deploy.server.model_queue import Job, ModelQueue

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "legacy_v0_1"
EN, _ = corpus(seed=5)


class Spy:
    """Stands between the engine and its `ctranslate2.Translator`: counts the sentences of
    each `translate_batch` call and runs it unchanged."""

    def __init__(self, ct2: Any, on_submit: Any = None) -> None:
        self.ct2, self.calls, self.on_submit = ct2, [], on_submit

    def translate_batch(self, source: list, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(len(source))
        if self.on_submit is not None:
            self.on_submit(len(self.calls))
        return self.ct2.translate_batch(source, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ct2, name)


@pytest.fixture(scope="module")
def engines() -> tuple[Translator, CT2Translator]:
    return (
        Translator.from_checkpoint(FIXTURE / "tiny.ckpt", device="cpu"),
        CT2Translator(FIXTURE / "ct2", threads=2),
    )


def spied(engine: CT2Translator, on_submit: Any = None) -> Spy:
    spy = Spy(engine.ct2 if not isinstance(engine.ct2, Spy) else engine.ct2.ct2, on_submit)
    engine.ct2 = spy
    return spy


def test_groups_follow_ctranslate2s_rule_cut_at_the_grain() -> None:
    """CTranslate2 (src/batch_reader.cc): longest source first, a batch filled while the sum
    of lengths stays within max_batch_size, at least one example; here also <= grain."""
    lengths = [3, 9, 4, 9, 1, 5, 2]
    assert ct2_batches(lengths, max_tokens=20, max_sentences=8) == [[1, 3], [5, 2, 0, 6, 4]]
    assert ct2_batches(lengths, max_tokens=20, max_sentences=2) == [[1, 3], [5, 2], [0, 6], [4]]
    assert ct2_batches([30, 2], max_tokens=10, max_sentences=8) == [[0], [1]]  # one too long
    assert ct2_batches([], max_tokens=10, max_sentences=8) == []


@pytest.mark.parametrize("beam_size", [1, 4])
def test_sub_batches_give_the_whole_calls_translations(engines, beam_size: int) -> None:
    torch_engine, engine = engines
    ids = [engine.prepare(s) for s in EN[:60]]
    options = dict(beam_size=beam_size, n_best=beam_size, length_penalty=1.0)
    spy = spied(engine)
    whole = engine.search_ids(ids, **options)
    whole_calls = list(spy.calls)
    spy.calls.clear()
    with stop_when(lambda: False, grain=3):
        split = engine.search_ids(ids, **options)
    assert len(whole_calls) < len(spy.calls)  # it did split ...
    assert max(spy.calls) <= 3 and sum(spy.calls) == sum(whole_calls) == 60  # ... by the grain
    assert_parity(torch_engine, ids, whole, split, **options)


def test_a_stop_is_seen_before_the_next_sub_batch(engines) -> None:
    _, engine = engines
    ids = [engine.prepare(s) for s in EN[:60]]
    spy = spied(engine)
    with stop_when(lambda: len(spy.calls) >= 4, grain=2), pytest.raises(DecodeStopped):
        engine.search_ids(ids, beam_size=4)
    assert len(spy.calls) == 4  # 30 sub-batches of 2; none submitted after the check


def test_outside_stop_when_every_call_is_submitted_whole(engines) -> None:
    _, engine = engines
    ids = [engine.prepare(s) for s in EN[:60]]
    spy = spied(engine)
    engine.search_ids(ids, beam_size=4, max_len_a=0.0, max_len_b=12)  # one budget: one call
    assert spy.calls == [60]


def test_the_server_queue_stops_a_ct2_batch_its_clients_left(engines) -> None:
    """The model queue (`ModelQueue`, as the server runs it) with the real ct2 engine: a long
    batch whose only client goes stops after the sub-batches then in flight, and the next job
    runs at once."""
    _, engine = engines
    started = threading.Event()
    spy = spied(engine, on_submit=lambda n: started.set())
    texts = EN * 20  # far more sub-batches of 2 than the test lets run

    def run(items: list[str]) -> list[str]:
        return engine.translate(items, beam_size=4)

    async def main(pool: ThreadPoolExecutor) -> tuple[ModelQueue, list[str]]:
        q = ModelQueue(
            pool, max_batch_sentences=len(texts), max_wait_ms=0, max_queue=8, stop_grain=2
        )
        q.start()
        try:
            long = q.submit(Job(run, texts, key="t"))
            while not started.is_set():
                await asyncio.sleep(0.005)
            long.cancel()  # its client went
            nxt = await asyncio.wait_for(q.submit(Job(run, EN[:2], key="u")), 30)
            return q, nxt
        finally:
            await q.stop()

    with ThreadPoolExecutor(1) as pool:
        q, nxt = asyncio.run(main(pool))
    assert q.stopped == 1 and len(nxt) == 2
    long_calls = len(spy.calls) - 1  # the next job's two sentences are one sub-batch
    assert long_calls < len(texts) // 2 // 4, f"{long_calls} sub-batches ran after the cancel"
