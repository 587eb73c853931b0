"""One decoding API: `DecodeConfig` (every decoding setting and its default) and `decode()`.

Every caller decodes through `decode(models, src, config)`: the validation callback, the
`Translator` (translate, evaluate, the server), the benchmark. The defaults live in
`DecodeConfig` only; configs override them (`DecodeConfig.from_options` drops absent and
null keys, so a YAML key left ``null`` means the dataclass default).

Methods:

- ``beam``: `litmt.decoding.search.beam_search` (``beam_size == 1`` runs greedy, the same result);
- ``greedy``: `litmt.decoding.search.greedy_search`;
- ``sample``: ancestral sampling (`sample_search`) for back-translation: each step draws
  the next token from the model's distribution at ``temperature``, cut to the ``top_k``
  most likely tokens and to the smallest set whose probability reaches ``top_p``; ``n_best``
  samples per source, drawn with a ``torch.Generator`` seeded with ``seed``. Temperature 0
  takes the most likely token (greedy).

`models` is one `Seq2SeqTransformer` or a list of them (an `litmt.decoding.ensemble.Ensemble`: the
log of the mean of the models' probabilities at every step).

Shapes: B sentences, N samples per sentence, R = B*N rows, S source length, V target
vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from litmt.decoding.config import METHODS, DecodeConfig, decoding_options
from litmt.decoding.ensemble import Ensemble
from litmt.decoding.search import (
    NEG_INF,
    Hypothesis,
    StepModel,
    beam_search,
    decode_rows,
    greedy_search,
)
from litmt.models import Seq2SeqTransformer

_D = DecodeConfig()  # keyword defaults of the functions below


def as_step_model(models: Seq2SeqTransformer | Sequence[Seq2SeqTransformer]) -> StepModel:
    """One model as it is; a list of models as an `Ensemble` (even a list of one)."""
    if isinstance(models, Seq2SeqTransformer | Ensemble):
        return models
    return Ensemble(list(models))


def make_generator(config: DecodeConfig, device: torch.device) -> torch.Generator | None:
    """A generator on `device` seeded with ``config.seed`` (None: torch's global one)."""
    if config.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(config.seed))


@torch.no_grad()
def decode(
    models: Seq2SeqTransformer | Sequence[Seq2SeqTransformer],
    src: Tensor,
    config: DecodeConfig | None = None,
    *,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch of sources with one model or an ensemble.

    Args:
        models: a model in eval mode, or a list of them (an ensemble; they must share the
            target vocabulary).
        src: (B, S) source ids, right-padded with pad.
        config: the settings; None = the defaults.
        generator: method "sample": the random generator (None: a fresh one seeded with
            ``config.seed``). Pass one generator to successive calls to continue its stream.

    Returns:
        For each source row, its hypotheses best first: ``n_best`` of them for beam and
        sampling (a beam may finish fewer), one for greedy.
    """
    config = config or DecodeConfig()
    model = as_step_model(models)
    method = config.effective_method
    common = dict(
        max_len_a=config.max_len_a,
        max_len_b=config.max_len_b,
        length_penalty=config.length_penalty,
        min_len=config.min_len,
    )
    if method == "greedy":
        return [[h] for h in greedy_search(model, src, **common)]
    if method == "beam":
        return beam_search(model, src, beam_size=config.beam_size, n_best=config.n_best, **common)
    if generator is None:
        generator = make_generator(config, src.device)
    return sample_search(
        model,
        src,
        n=config.n_best,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        generator=generator,
        **common,
    )


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
    *,
    n: int = _D.n_best,
    temperature: float = _D.temperature,
    top_k: int = _D.top_k,
    top_p: float = _D.top_p,
    generator: torch.Generator | None = None,
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
    length_penalty: float = _D.length_penalty,
    min_len: int = _D.min_len,
) -> list[list[Hypothesis]]:
    """Ancestral sampling: `n` independent samples per source, batched (B * N rows).

    The encoder runs once per source; its state is fanned out to N rows. Each step draws
    from softmax(logits / temperature) restricted by `filter_logits`; temperature 0 takes the
    argmax. The length budget and `min_len` act as in the searches. The reported
    ``log_prob`` is the model's own log-probability of the sample (temperature 1, no
    cut: the number `litmt.decoding.forced` gives for the same pair), ``score`` its GNMT
    normalisation.

    Args:
        model: a model in eval mode or an `Ensemble`.
        src: (B, S) source ids, right-padded.
        n: samples per source.
        generator: random generator on src's device (None: torch's global one).

    Returns:
        For each source row, its `n` samples sorted by decreasing score.
    """

    def rule(logits: Tensor, logp: Tensor) -> Tensor:
        if temperature == 0:
            return logp.argmax(dim=-1)  # (R,)
        # the same eos constraints: -inf entries of logp stay -inf in the tempered scores
        scores = torch.where(torch.isfinite(logp), logits / temperature, NEG_INF)
        probs = filter_logits(scores, top_k, top_p).softmax(dim=-1)  # (R, V)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (R,)

    hyps = decode_rows(
        model,
        src,
        n=n,
        rule=rule,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        length_penalty=length_penalty,
        min_len=min_len,
    )
    return [
        sorted(hyps[i : i + n], key=lambda h: h.score, reverse=True) for i in range(0, len(hyps), n)
    ]


__all__ = [
    "METHODS",
    "DecodeConfig",
    "decode",
    "decoding_options",
    "filter_logits",
    "make_generator",
    "sample_search",
]
