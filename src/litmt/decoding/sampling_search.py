"""Ancestral sampling for back-translation: logit filters (top-k, top-p) and `sample_search`.

Each step draws the next token from the model's distribution at ``temperature``, cut to the
``top_k`` most likely tokens and to the smallest set whose probability reaches ``top_p``;
``n_best`` samples per source, drawn with a ``torch.Generator`` seeded with ``seed``.
Temperature 0 takes the most likely token (greedy). The step loop is the searches' own
(`litmt.decoding.search.decode_rows`).

Shapes: B sentences, N samples per sentence, R = B*N rows, S source length, V target
vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from litmt.decoding.config import DecodeConfig
from litmt.decoding.search import decode_rows, shared_limits
from litmt.decoding.search_rules import NEG_INF, Hypothesis, StepModel

_D = DecodeConfig()  # keyword defaults of the functions below


def make_generator(config: DecodeConfig, device: torch.device) -> torch.Generator | None:
    """A generator on `device` seeded with ``config.seed`` (None: torch's global one)."""
    if config.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(config.seed))


@torch.no_grad()
def filter_logits(logits: Tensor, top_k: int = _D.top_k, top_p: float = _D.top_p) -> Tensor:
    """Set to -inf every token outside the top-k and outside the top-p nucleus (out of place).

    Args:
        logits: (R, V) scores (log-probabilities or logits; only their order and softmax
            matter).
        top_k: keep the k largest per row (0 = all).
        top_p: keep, per row, the most likely tokens up to the first one whose cumulative
            probability reaches `top_p` (that token included, so at least one is kept);
            1.0 = all.

    Returns:
        (R, V)
    """
    out = logits.clone()
    vocab = out.size(-1)
    if 0 < top_k < vocab:
        kth = out.topk(top_k, dim=-1).values[:, -1:]  # (R, 1) the k-th largest
        out.masked_fill_(out < kth, NEG_INF)
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)  # (R, V)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # (R, V) mass of the more likely tokens
        drop_sorted = before >= top_p  # the first token has 0 before it: always kept
        drop = drop_sorted.scatter(1, order, drop_sorted)  # back to vocabulary order
        out.masked_fill_(drop, NEG_INF)
    return out


@torch.no_grad()
def sample_search(
    model: StepModel,
    src: Tensor,
    config: DecodeConfig,
    *,
    generator: torch.Generator | None = None,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Ancestral sampling: ``config.n_best`` independent samples per source, batched (B * N
    rows).

    The encoder runs once per source; its state is fanned out to N rows. Each step draws
    from softmax(logits / temperature) restricted by `filter_logits`; temperature 0 takes the
    argmax. The length budget and `min_len` act as in the searches. The reported
    ``log_prob`` is the model's own log-probability of the sample (temperature 1, no
    cut: the number `litmt.decoding.forced` gives for the same pair), ``score`` its GNMT
    normalisation.

    Args:
        model: a model in eval mode or an `Ensemble`.
        src: (B, S) source ids, right-padded.
        config: n_best (samples per source), temperature, top_k, top_p, and the length
            settings (max_len_a, max_len_b, length_penalty, min_len).
        generator: random generator on src's device (None: torch's global one).
        sync_steps: every rank runs the same number of decoder steps (`decode_rows`).
        prefixes: B lists of target ids every sample of that source starts with.

    Returns:
        For each source row, its `n` samples sorted by decreasing score.
    """
    temperature, n = config.temperature, config.n_best

    def rule(logits: Tensor, logp: Tensor) -> Tensor:
        if temperature == 0:
            return logp.argmax(dim=-1)  # (R,)
        # the same eos constraints: -inf entries of logp stay -inf in the tempered scores
        scores = torch.where(torch.isfinite(logp), logits / temperature, NEG_INF)
        probs = filter_logits(scores, config.top_k, config.top_p).softmax(dim=-1)  # (R, V)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (R,)

    hyps = decode_rows(model, src, n=n, rule=rule, **shared_limits(config, sync_steps, prefixes))
    return [
        sorted(hyps[i : i + n], key=lambda h: h.score, reverse=True) for i in range(0, len(hyps), n)
    ]
