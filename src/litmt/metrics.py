"""Corpus metrics, computed by sacreBLEU only (BLEU, chrF, TER), with their signatures; and
sentence BLEU (sacreBLEU's `sentence_score`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from litmt.errors import DataError

METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}
_SENTENCE_BLEU = BLEU(effective_order=True)  # sentence_bleu's scorer (built once)


@dataclass(frozen=True)
class MetricResult:
    """One corpus score.

    Attributes:
        name: sacreBLEU's name ("BLEU", "chrF2", "TER").
        score: the corpus score (0-100; lower is better for TER).
        signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|...``.
        line: the sacreBLEU report line, ``BLEU|<signature> = 35.12 66.1/41.0/... (BP = ...)``.
    """

    name: str
    score: float
    signature: str
    line: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready)."""
        return asdict(self)


def _reference_streams(refs: Sequence[str] | Sequence[Sequence[str]], n: int) -> list[list[str]]:
    streams = [list(refs)] if not refs or isinstance(refs[0], str) else [list(r) for r in refs]
    for i, stream in enumerate(streams):
        if len(stream) != n:
            raise DataError(
                f"{n} hypotheses but reference stream {i + 1} has {len(stream)} lines; "
                "they must align line by line"
            )
    return streams


def corpus_scores(
    hyps: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
) -> dict[str, MetricResult]:
    """Score detokenised hypotheses against references with sacreBLEU's default settings.

    Args:
        hyps: one detokenised hypothesis per sentence.
        refs: one reference per sentence (a list of str), or several reference streams
            (a list of such lists).
        metrics: any of "bleu", "chrf", "ter".

    Returns:
        {"bleu": MetricResult, "chrf": ..., "ter": ...} in the order asked.
    """
    if not hyps:
        raise DataError("no sentences to score")
    streams = _reference_streams(refs, len(hyps))
    out = {}
    for key in metrics:
        if key not in METRICS:
            raise DataError(f"unknown metric '{key}'; valid names: {', '.join(METRICS)}")
        metric = METRICS[key]()
        result = metric.corpus_score(list(hyps), streams)
        signature = str(metric.get_signature())
        out[key] = MetricResult(
            result.name, float(result.score), signature, result.format(signature=signature)
        )
    return out


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """sacreBLEU corpus BLEU (13a tokenisation, exp smoothing), 0-100."""
    return corpus_scores(hyps, refs, metrics=("bleu",))["bleu"].score


def sentence_bleu(hyp: str, ref: str) -> float:
    """sacreBLEU sentence BLEU of one hypothesis against one reference, 0-100: 13a
    tokenisation, exp smoothing and the effective n-gram order (a short sentence is not zero
    for lacking 4-grams), as ``sacrebleu.sentence_bleu``."""
    return float(_SENTENCE_BLEU.sentence_score(hyp, [ref]).score)
