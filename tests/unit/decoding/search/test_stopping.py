"""A search stops between two decoder steps once its caller's check says so
(`litmt.decoding.search.stopping`), in every search loop that `decode()` dispatches to, and
only inside `stop_when`: the same decode outside it runs to the end."""

from __future__ import annotations

import threading

import pytest
import torch
from tiny_model import tiny_config

from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.stopping import DecodeStopped, check_stop, stop_when
from litmt.models import Seq2SeqTransformer

VOCAB = 40


def model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB)).eval()


def src() -> torch.Tensor:
    s = torch.randint(4, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    s[2, 5:] = PAD_ID
    return s


class AfterSteps:
    """A check that turns true on its `n`-th call (the search calls it once per step)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.n


CASES = {
    "greedy": (DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=20, min_len=10), {}),
    "sample": (
        DecodeConfig(method="sample", top_k=5, seed=1, max_len_a=0.0, max_len_b=20, min_len=10),
        {},
    ),
    "beam": (DecodeConfig(beam_size=4, max_len_a=0.0, max_len_b=20, min_len=10), {}),
    "constrained": (
        DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=20, min_len=10),
        {"constraints": [[[7, 8]], [], [[9]]]},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_search_stops_at_the_step_its_check_turns_true(name: str) -> None:
    cfg, extra = CASES[name]
    m, s = model(), src()
    with torch.no_grad():
        full = decode([m], s, cfg, **extra)  # outside stop_when: runs to the end
        check = AfterSteps(3)
        with stop_when(check), pytest.raises(DecodeStopped, match="stopped at step 3"):
            decode([m], s, cfg, **extra)
        assert check.calls == 4  # checked once per step: steps 0, 1, 2 ran, 3 stopped
        again = decode([m], s, cfg, **extra)  # the block's check is gone again
    assert [[x.tokens for x in h] for h in again] == [[x.tokens for x in h] for h in full]


def test_the_check_is_local_to_its_context() -> None:
    seen: list[BaseException | None] = []

    def other_thread() -> None:
        try:
            check_stop(0)
            seen.append(None)
        except DecodeStopped as exc:
            seen.append(exc)

    with stop_when(lambda: True):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        with pytest.raises(DecodeStopped):
            check_stop(5)
    assert seen == [None]  # a decode in another thread never sees this block's check
    check_stop(0)  # and after the block nothing stops
