"""Ensemble decoding: several models decode together, each with its own decoder state.

At every step each model gives its log-probabilities log p_m(y | ...) for the same prefix;
the ensemble's are the log of their mean probability,

    log p(y) = logsumexp_m(log p_m(y)) - log M,

as fairseq's `EnsembleModel.forward_decoder` (``fairseq/sequence_generator.py``) computes
them. The result is normalised, so the searches (`litmt.decoding.search.beam`), which apply a
log-softmax to what `decode_step` returns, see exactly these log-probabilities. Each
model keeps its own encoder output, cross-attention K/V and self-attention cache; the
search reorders them all together. The models must share the target vocabulary (the
loaders also demand the same tokenizer: `litmt.decoding.translator.Translator.from_checkpoint`).

This is distinct from weight averaging (`litmt.checkpoint.average.average_checkpoints`), which
makes one model out of several checkpoints of one run.

Shapes: M models, R decoder rows, S source length, C d_model, V target vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.models.transformer import DecoderState


@dataclass
class EnsembleState:
    """The M models' decoder states, reordered together."""

    states: list[DecoderState]

    def reorder(self, index: Tensor, *, cross: bool = True) -> None:
        """Keep rows `index` (R',) in every model's state (see `DecoderState.reorder`)."""
        for state in self.states:
            state.reorder(index, cross=cross)


class Ensemble:
    """M models decoded as one (`litmt.decoding.search.rules.StepModel`).

    Args:
        models: the models, in eval mode, with equal source and target vocabulary sizes.

    Raises:
        ConfigError: no model, or vocabularies of different sizes.
    """

    def __init__(self, models: Sequence[Seq2SeqTransformer]) -> None:
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        sizes = {(m.config.src_vocab_size, m.config.tgt_vocab_size) for m in models}
        if len(sizes) > 1:
            raise ConfigError(
                f"ensemble members must share the vocabulary; (source, target) sizes {sorted(sizes)}"
            )
        self.models = list(models)
        self.pad_id = models[0].pad_id
        # the shortest max_positions bounds every member's source and output length
        self.config = dataclasses.replace(
            models[0].config, max_positions=min(m.config.max_positions for m in models)
        )

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """Each model's memory (B, S, C) and the source padding mask (B, S)."""
        encoded = [m.encode(src) for m in self.models]
        return [memory for memory, _ in encoded], encoded[0][1]

    def init_state(
        self, memory: list[Tensor], src_padding_mask: Tensor | None, capacity: int | None = None
    ) -> EnsembleState:
        """One `DecoderState` per model (see `Seq2SeqTransformer.init_state`)."""
        return EnsembleState(
            [
                m.init_state(mem, src_padding_mask, capacity)
                for m, mem in zip(self.models, memory, strict=True)
            ]
        )

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        """The ensemble's next-token log-probabilities (R, V) after `tokens` (R,), float32."""
        logps = torch.stack(
            [
                F.log_softmax(m.decode_step(tokens, s).float(), dim=-1)
                for m, s in zip(self.models, state.states, strict=True)
            ]
        )  # (M, R, V)
        return torch.logsumexp(logps, dim=0) - math.log(len(self.models))


__all__ = ["Ensemble", "EnsembleState"]
