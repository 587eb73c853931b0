"""Decision margins of litmt's torch search, and the tolerances of decode parity between two
computations (engines, batch shapes, CPUs), shared by the parity tests (`tests/helpers/parity.py`
imports them) and the parity benchmarks (`checks.prefix_parity`).

Shapes: S source length, t prefix length, T output length, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

import litmt.decoding.search.beam
from litmt.data.tokenization.tokenizer import BOS_ID

# The same hypothesis scored by two computations (engines, batch shapes, CPUs): |difference| of
# its log-probability or length-normalised score. 300x the largest difference measured (3e-6).
SCORE_ATOL = 1e-3
# Two different choices are a near-tie when their values differ by at most this under both
# computations: it is the margin below which float32 rounding of the ~20 log-probabilities
# summed into a beam's score (each exact to ~1e-7 relative) may reorder them on another CPU.
NEAR_TIE = 1e-3


def teacher_forced_log_probs(translator, src: Sequence[int], prefix: Sequence[int]) -> torch.Tensor:
    """(t + 1, V) log-probabilities of each next target token after bos + `prefix`, torch
    engine (row i: after the first i tokens of `prefix`)."""
    src_t = torch.tensor([list(src)], device=translator.device)  # (1, S)
    tgt_in = torch.tensor([[BOS_ID, *prefix]], device=translator.device)  # (1, t + 1)
    with torch.no_grad():
        logits = translator.model(src_t, tgt_in)[0].float()  # (t + 1, V)
    return F.log_softmax(logits, dim=-1).cpu()


@contextmanager
def beam_margins() -> Iterator[list[float]]:
    """Record the smallest decision margin of each `litmt.decoding.search.beam.beam_search` step.

    Each step of litmt's beam search ranks candidates by cumulative log-probability and keeps
    the 2K best: which beams live on, which finish and which fall out are all decided by the
    order of the 2K + 1 best. The recorded margin is the smallest gap between two adjacent
    ones (finite values only). A sentence decoded on its own whose smallest margin is under
    `NEAR_TIE` may be decided differently by another computation.
    """
    margins: list[float] = []
    original = litmt.decoding.search.beam.topk_rows

    def recording(x: torch.Tensor, k: int, chunk: int = 64):
        top = x.topk(min(k + 1, x.size(-1)), dim=-1).values  # (R, k + 1), sorted
        for row in top:
            row = row[torch.isfinite(row)]
            if row.numel() > 1:
                margins.append(float((row[:-1] - row[1:]).min()))
        return original(x, k, chunk)

    litmt.decoding.search.beam.topk_rows = recording
    try:
        yield margins
    finally:
        litmt.decoding.search.beam.topk_rows = original


def greedy_margin(translator, src: Sequence[int], prefix: Sequence[int] = ()) -> float:
    """The smallest gap between the two most likely next tokens along the torch engine's
    greedy output for one sentence (teacher-forced, eos included), after its `prefix`."""
    prefixes = [list(prefix)] if prefix else None
    out = translator.search_ids([list(src)], beam_size=1, prefixes=prefixes)[0][0].tokens
    logp = teacher_forced_log_probs(translator, src, out)[len(prefix) :]  # (T - t, V)
    top2 = logp.topk(2, dim=-1).values  # (T - t, 2)
    return float((top2[:, 0] - top2[:, 1]).min())


def search_margin(translator, src: Sequence[int], **options) -> float:
    """The smallest decision margin of the torch engine's search (greedy or beam) on `src`."""
    if options.get("beam_size", 1) == 1:
        prefixes = options.get("prefixes")
        return greedy_margin(translator, src, prefixes[0] if prefixes else ())
    with beam_margins() as margins:
        translator.search_ids([list(src)], **options)
    return min(margins, default=float("inf"))
