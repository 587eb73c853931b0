"""One decoding entry point: `decode()`, which picks a search from a `DecodeConfig`.

Every caller decodes through `decode(models, src, config)`: the validation callback, the
`Translator` (translate, evaluate, the server), the benchmark. The defaults live in
`DecodeConfig` only; configs override them (`DecodeConfig.from_options` drops absent and
null keys, so a YAML key left ``null`` means the dataclass default).

Methods:

- ``beam``: `litmt.decoding.search.beam_search` (``beam_size == 1`` runs greedy, the same result);
- ``greedy``: `litmt.decoding.search.greedy_search`;
- ``sample``: ancestral sampling (`litmt.decoding.sampling.sample_search`) for back-translation: each step draws
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

from litmt.decoding.config import DecodeConfig
from litmt.decoding.ensemble import Ensemble
from litmt.decoding.sampling import make_generator, sample_search
from litmt.decoding.search import Hypothesis, StepModel, beam_search, greedy_search
from litmt.models import Seq2SeqTransformer

_D = DecodeConfig()  # keyword defaults of the functions below


def as_step_model(models: Seq2SeqTransformer | Sequence[Seq2SeqTransformer]) -> StepModel:
    """One model as it is; a list of models as an `Ensemble` (even a list of one)."""
    if isinstance(models, Seq2SeqTransformer | Ensemble):
        return models
    return Ensemble(list(models))


def decode(
    models: Seq2SeqTransformer | Sequence[Seq2SeqTransformer],
    src: Tensor,
    config: DecodeConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    sync_steps: bool = False,
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
            steps (needed under FSDP; see `litmt.decoding.search`).

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
        sync_steps=sync_steps,
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


__all__ = ["decode"]
