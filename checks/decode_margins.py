"""The parity rule of decoding between two computations (engines, batch shapes, CPUs): its
tolerances and where a difference is measured, shared by the parity tests
(`tests/helpers/parity.py` asserts it) and the parity checks of ``checks/``.

Two outputs of a sentence may differ only where they part at a near-tie of the reference (the
torch model's own log-probabilities there: `parting_gaps`), and only a few sentences may
(`EXCUSE_CAP`, `max_excused`); `compare_outputs` applies it to a whole comparison.

Shapes: S source length, t prefix length, T output length, V target vocabulary.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID
from litmt.decoding.search.rules import Hypothesis, length_penalty_factor

# The same hypothesis scored by two computations (engines, batch shapes, CPUs): |difference| of
# its log-probability or length-normalised score. 300x the largest difference measured (3e-6).
SCORE_ATOL = 1e-3
# Two different choices are a near-tie when their values differ by at most this under both
# computations: it is the margin below which float32 rounding of the ~20 log-probabilities
# summed into a beam's score (each exact to ~1e-7 relative) may reorder them on another CPU.
NEAR_TIE = 1e-3
# The share of a comparison's sentences that may differ at near-ties (at least one): a few
# sentences of a test set meet a near-tie; many differing sentences are a bug, however small
# their gaps.
EXCUSE_CAP = 0.05


def teacher_forced_log_probs(translator, src: Sequence[int], prefix: Sequence[int]) -> torch.Tensor:
    """(t + 1, V) log-probabilities of each next target token after bos + `prefix` (row i:
    after the first i tokens of `prefix`): one forward pass of a torch-engine translator's
    model, or, for an engine without one (``engine=onnx``), its step model's decoder steps
    (``encode``, then ``decode_step`` per token, as its searches run it)."""
    if translator.model is None:
        model = translator.step_model
        state, _ = model.encode(torch.tensor([list(src)]))  # (1, S)
        rows = [model.decode_step(torch.tensor([tok]), state)[0] for tok in [BOS_ID, *prefix]]
        return F.log_softmax(torch.stack(rows).float(), dim=-1)  # (t + 1, V)
    src_t = torch.tensor([list(src)], device=translator.device)  # (1, S)
    tgt_in = torch.tensor([[BOS_ID, *prefix]], device=translator.device)  # (1, t + 1)
    with torch.no_grad():
        logits = translator.model(src_t, tgt_in)[0].float()  # (t + 1, V)
    return F.log_softmax(logits, dim=-1).cpu()


# -- the parity rule: where two outputs part, and how many may -----------------------------
def _hypotheses(translator, item: Any) -> list[list[int]]:
    """One sentence's output as a best-first list of token lists: from a text (encoded with the
    target tokenizer), a token list, an n-best list of token lists or of `Hypothesis`."""
    if isinstance(item, str):
        return [translator.tokenizer.encode_tgt([item])[0]]
    if isinstance(item, Hypothesis):
        return [list(item.tokens)]
    items = list(item)
    if not items or isinstance(items[0], int):
        return [items]
    return [list(h.tokens) if isinstance(h, Hypothesis) else list(h) for h in items]


def hypothesis_score(translator, src: Sequence[int], tokens: Sequence[int], alpha: float) -> float:
    """The reference's GNMT score of `tokens` + eos on `src` (teacher-forced, as its search
    ranks finished hypotheses)."""
    logp = teacher_forced_log_probs(translator, src, tokens)  # (T + 1, V)
    targets = [*tokens, EOS_ID]
    total = float(sum(logp[t, tok] for t, tok in enumerate(targets)))
    return total / float(length_penalty_factor(len(targets), alpha))


def parting_gaps(
    translator, src: Sequence[int], a: Sequence[int], b: Sequence[int], alpha: float = 1.0
) -> tuple[float, float]:
    """How far apart the reference holds two outputs of `src` where they part: (the
    log-probability gap of their two tokens at the first position where ``a + eos`` and
    ``b + eos`` differ: the step decision; the gap of their two GNMT scores: the ranking of
    finished hypotheses). (0.0, 0.0) for equal outputs."""
    x, y = [*a, EOS_ID], [*b, EOS_ID]
    if x == y:
        return 0.0, 0.0
    t = next(j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)  # eos ends both
    logp = teacher_forced_log_probs(translator, src, x[:t])[-1]  # (V,) after the shared prefix
    step = abs(float(logp[x[t]] - logp[y[t]]))
    score_a, score_b = (hypothesis_score(translator, src, h, alpha) for h in (a, b))
    return step, abs(score_a - score_b)


def parting_gap(
    translator, src: Sequence[int], a: Sequence[int], b: Sequence[int], alpha: float = 1.0
) -> float:
    """The parity rule's gap of two outputs: the smaller of `parting_gaps` (a near-tie of
    either the step where they part or their ranking as finished hypotheses)."""
    return min(parting_gaps(translator, src, a, b, alpha))


def max_excused(n: int) -> int:
    """How many of `n` sentences may differ at near-ties: `EXCUSE_CAP` of them, at least one."""
    return max(1, int(EXCUSE_CAP * n))


@dataclass
class Comparison:
    """Two computations' outputs of the same sentences under the parity rule: for each sentence
    that differs, the reference's `parting_gap` at the first rank where its lists differ."""

    n: int
    near_ties: dict[int, float] = field(default_factory=dict)  # gap <= NEAR_TIE
    real: dict[int, float] = field(default_factory=dict)  # gap > NEAR_TIE (or lists cut short)
    parted: dict[int, str] = field(default_factory=dict)  # where each differing sentence parts

    @property
    def ok(self) -> bool:
        """No real difference, and at most `max_excused` near-ties."""
        return not self.real and len(self.near_ties) <= max_excused(self.n)


def compare_outputs(
    translator,
    sources: Sequence[Sequence[int]],
    ref: Sequence[Any],
    got: Sequence[Any],
    alpha: float = 1.0,
) -> Comparison:
    """`ref` against `got` (per sentence: a text, a token list, or an n-best list of token
    lists or `Hypothesis`) under the parity rule, measured with the torch `translator` (the
    reference) and length penalty `alpha`."""
    out = Comparison(len(sources))
    for i, (src, a, b) in enumerate(zip(sources, ref, got, strict=True)):
        x, y = _hypotheses(translator, a), _hypotheses(translator, b)
        if x == y:
            continue
        j = next((r for r, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        if j is None:  # one list is a prefix of the other: an n-best list cut short
            out.real[i] = math.inf
            out.parted[i] = f"{len(x)} hypotheses against {len(y)}"
            continue
        gap = parting_gap(translator, src, x[j], y[j], alpha)
        (out.near_ties if gap <= NEAR_TIE else out.real)[i] = gap
        out.parted[i] = f"rank {j}: {x[j]} != {y[j]}"
    return out


def exit_status(results: Sequence[dict[str, Any]], label: str) -> int:
    """A parity check script's exit status under the rule: 1 when any difference is
    ``unexplained`` or a result's near-ties and ranking ties exceed `max_excused` of its
    ``lines`` (each result: ``lines``, ``differences`` with a ``category``, and `label`, the key
    naming it in the message, e.g. ``beam``), else 0."""
    unexplained = sum(d["category"] == "unexplained" for r in results for d in r["differences"])
    over_cap = [
        r[label]
        for r in results
        if sum(d["category"] in ("near-tie", "ranking tie") for d in r["differences"])
        > max_excused(r["lines"])
    ]
    if over_cap:
        print(f"more near-ties than the parity rule excuses ({label} {over_cap})", file=sys.stderr)
    return 1 if unexplained or over_cap else 0
