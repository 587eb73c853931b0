"""One decoding entry point: `decode()`, which picks a search from a `DecodeConfig`.

Every caller decodes through `decode(models, src, config)`: the validation callback, the
`Translator` (translate, evaluate, the server), the benchmark. The defaults live in
`DecodeConfig` only; configs override them (`DecodeConfig.from_options`: an absent key keeps
the default, ``seed: null`` is torch's global generator).

Methods:

- ``beam``: `litmt.decoding.search.beam.beam_search` (``beam_size == 1`` runs greedy, the same result);
- ``greedy``: `litmt.decoding.search.greedy.greedy_search`;
- ``sample``: ancestral sampling (`litmt.decoding.search.greedy.sample_search`) for
  back-translation: each step draws the next token from the model's distribution at
  ``temperature``, cut to the ``top_k`` most likely tokens and to the smallest set whose
  probability reaches ``top_p``; ``n_best`` samples per source, drawn with a
  ``torch.Generator`` seeded with ``seed``. Temperature 0 takes the most likely token
  (greedy).

Steering (`litmt.decoding.steering`): ``prefixes`` (target ids each output starts with) work
with every method; ``constraints`` (target id sequences each output must contain) run the
lexically constrained beam search (`litmt.decoding.search.constrained.constrained_search`)
with ``beam_size`` beams (greedy: 1), raised for a sentence to its constraint pieces + 1
where that is more (`litmt.decoding.search.rules.beam_groups`),
on the sentences that have any, while the others of the batch take the ordinary search, so
their results are those of a batch without constraints. Sampling refuses constraints.

`models` is one `Seq2SeqTransformer` or a list of them (an `litmt.decoding.ensemble.Ensemble`: the
log of the mean of the models' probabilities at every step).

Shapes: B sentences, N samples per sentence, R = B*N rows, S source length, V target
vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from litmt.decoding.config import DecodeConfig
from litmt.decoding.ensemble import Ensemble
from litmt.decoding.search.beam import beam_search
from litmt.decoding.search.constrained import check_constraint_ids, constrained_search
from litmt.decoding.search.constraint_tracker import WordPieces
from litmt.decoding.search.greedy import greedy_search, make_generator, sample_search
from litmt.decoding.search.rules import Hypothesis, StepModel, beam_groups, shared_limits
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

log = logging.getLogger(__name__)


def as_step_model(models: StepModel | Sequence[Seq2SeqTransformer]) -> StepModel:
    """One model (any `StepModel`: a model, an `Ensemble`, the ONNX engine's) as it is; a
    list of models as an `Ensemble` (even a list of one)."""
    if not isinstance(models, Sequence):
        return models
    return Ensemble(list(models))


def decode(
    models: StepModel | Sequence[Seq2SeqTransformer],
    src: Tensor,
    config: DecodeConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    sync_steps: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    words: WordPieces | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch of sources with one model or an ensemble.

    Args:
        models: a model in eval mode, or a list of them (an ensemble; they must share the
            target vocabulary).
        src: (B, S) source ids, right-padded with pad.
        config: the settings; None = the defaults.
        generator: method "sample": the random generator (None: a fresh one seeded with
            ``config.seed``). Pass one generator to successive calls to continue its stream.
        sync_steps: every rank of the default process group runs the same number of decoder
            steps (needed under FSDP; see `litmt.decoding.search.beam`).
        prefixes: B lists of target ids (possibly empty) each output starts with; None = none.
        constraints: B lists of constraints (target id lists); None = none.
        words: the target pieces that continue a word (blocked right after a constraint is
            completed, so it ends a word) and the constraints' glued forms
            (`litmt.decoding.search.constraint_tracker.WordPieces`); None = neither.

    Returns:
        For each source row, its hypotheses best first: ``n_best`` of them for beam and
        sampling (a beam may finish fewer), one for greedy.
    """
    config = config or DecodeConfig()
    model = as_step_model(models)
    if prefixes is not None and len(prefixes) != src.size(0):
        raise ConfigError(f"{len(prefixes)} prefixes for {src.size(0)} sentences")
    if constraints is not None and any(constraints):
        return _decode_constrained(model, src, config, prefixes, constraints, sync_steps, words)
    prefixes = prefixes if prefixes is not None and any(prefixes) else None
    if config.effective_method == "sample":
        generator = generator or make_generator(config, src.device)
        return sample_search(
            model, src, config, generator=generator, sync_steps=sync_steps, prefixes=prefixes
        )
    limits = shared_limits(config, sync_steps, prefixes)
    if config.effective_method == "greedy":
        return [[h] for h in greedy_search(model, src, **limits)]
    return beam_search(model, src, beam_size=config.beam_size, n_best=config.n_best, **limits)


def _decode_constrained(
    model: StepModel,
    src: Tensor,
    config: DecodeConfig,
    prefixes: Sequence[Sequence[int]] | None,
    constraints: Sequence[Sequence[Sequence[int]]],
    sync_steps: bool,
    words: WordPieces | None,
) -> list[list[Hypothesis]]:
    """`decode` of a batch where some sentences have constraints: those run the constrained
    search, grouped by their beam size (`beam_groups`: at least their constraint pieces + 1),
    the others `decode` without constraints; input order kept."""
    check_constraint_ids(constraints, src.size(0))
    if config.effective_method == "sample":
        raise ConfigError("constraints need beam search; method=sample cannot apply them")
    beam = config.beam_size if config.method == "beam" else 1
    with_ = [i for i, c in enumerate(constraints) if c]
    without = [i for i, c in enumerate(constraints) if not c]
    out: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    for k, rows in beam_groups(config, constraints, with_):
        if k > beam:
            log.debug("beam %d raised to %d for %d constrained sentence(s)", beam, k, len(rows))
        found = constrained_search(
            model,
            src.index_select(0, torch.tensor(rows, device=src.device)),
            [constraints[i] for i in rows],
            config,
            beam_size=k,
            sync_steps=sync_steps,
            prefixes=None if prefixes is None else [prefixes[i] for i in rows],
            words=words,
        )
        for i, hyps in zip(rows, found, strict=True):
            out[i] = hyps
    if without:
        rows_t = torch.tensor(without, device=src.device)
        found = decode(
            model,
            src.index_select(0, rows_t),
            config,
            prefixes=None if prefixes is None else [prefixes[i] for i in without],
        )
        for i, hyps in zip(without, found, strict=True):
            out[i] = hyps
    return out


__all__ = ["decode"]
