"""The torch engine's translator: `Translator`, a model (or an ensemble) and its tokenizer.

>>> from litmt import Translator
>>> Translator.from_checkpoint("model.ckpt").translate(["A man is walking."])
['Ein Mann geht.']

Everything text-side (input hygiene, steering, directions, `translate`, `search_ids`, word
alignments) is `litmt.decoding.translator_base.BaseTranslator`'s, shared with the CTranslate2
engine; this adds loading a checkpoint and decoding a batch with
`litmt.decoding.search.dispatch.decode`. The translate command is `litmt.cli.translate`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from litmt.checkpoint.compat import tokenizer_difference
from litmt.checkpoint.load import load_model, resolve_device
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.decoding.batching import even_parts, padded, token_batches
from litmt.decoding.config import DecodeConfig
from litmt.decoding.languages import Languages
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.greedy import make_generator
from litmt.decoding.search.rules import Hypothesis, StepModel, beam_groups
from litmt.decoding.translator_base import (
    Aligned,
    BaseTranslator,
    DecodeRequest,
    NBest,
    Translation,
)
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.runtime.precision import autocast_context, plan_model_inference

log = logging.getLogger(__name__)


class Translator(BaseTranslator):
    """A model (or an ensemble) + tokenizer ready to translate plain text.

    Args:
        model: a `Seq2SeqTransformer`, or a list of them decoded as an ensemble
            (`litmt.decoding.ensemble`); put in eval mode and moved to `device`. ``self.model`` is
            the first (the attention explorer and forced decoding use it).
        tokenizer: its `Tokenizer`.
        src_lang: the source language code from the checkpoint (a multilingual model: its
            first direction).
        tgt_lang: the target language code, likewise.
        device: where to run; None picks CUDA when available.
        languages: the checkpoint's metadata (its ``directions`` and ``tag_placement``,
            `litmt.decoding.languages.Languages.from_meta`); None = the one pair.
    """

    def __init__(
        self,
        model: Seq2SeqTransformer | Sequence[Seq2SeqTransformer],
        tokenizer: Tokenizer,
        *,
        src_lang: str = "",
        tgt_lang: str = "",
        device: str | torch.device | None = None,
        languages: dict[str, Any] | None = None,
    ) -> None:
        self.device = resolve_device(device)
        self.languages = Languages.from_meta(languages or {}, src_lang, tgt_lang)
        members = [model] if isinstance(model, Seq2SeqTransformer) else list(model)
        self.models = [m.to(self.device).eval() for m in members]
        self.model = self.models[0]
        self.tokenizer, self.src_lang, self.tgt_lang = tokenizer, src_lang, tgt_lang
        self.autocast: torch.dtype | None = None  # decode under this autocast (None = fp32)
        # the base that decoding options override (an export carries its own, engines.py)
        self.default_config = DecodeConfig()

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        *,
        device: str | torch.device | None = None,
        attention: str | None = None,
        ensemble: bool = False,
    ) -> Translator:
        """Load a checkpoint (several paths: their weights are averaged, or an ensemble).

        The torch engine of `litmt.load_translator` (the entry point every command uses;
        ``load_translator(path)`` returns this), over the one checkpoint reader
        `litmt.checkpoint.load.load_model`; it only adds the decode precision plan and the
        ensemble's vocabulary check.

        Args:
            path: a `.ckpt` file or a list of them.
            device: "cpu", "cuda", ... or None for CUDA when available.
            attention: decode with this kernel at every site (e.g. "sdpa"); None keeps the
                checkpoint's backends.
            ensemble: decode the checkpoints as an ensemble (`litmt.decoding.ensemble`: mean of the
                models' probabilities at every step) instead of averaging their weights.

        Raises:
            CheckpointError: missing/corrupt checkpoint.
            BackendError: the checkpoint's kernel cannot run here (pass `attention`).
            ConfigError: ensemble members with different tokenizers.
        """
        if ensemble:
            paths = [path] if isinstance(path, str | Path) else list(path)
            members = [cls.from_checkpoint(p, device=device, attention=attention) for p in paths]
            first = members[0]
            for p, member in zip(paths[1:], members[1:], strict=True):
                # the same ids must mean the same pieces (identical bytes, or the same pieces)
                differs = tokenizer_difference(first.tokenizer, member.tokenizer)
                if differs is not None:
                    raise ConfigError(
                        f"ensemble members must share the vocabulary: {paths[0]} vs {p}: {differs}"
                    )
            translator = cls(
                [m.model for m in members],
                first.tokenizer,
                src_lang=first.src_lang,
                tgt_lang=first.tgt_lang,
                device=first.device,
                languages=first.languages_meta(),
            )
            translator.autocast = first.autocast
            return translator
        dev = resolve_device(device)
        loaded = load_model(path, dev, attention=attention)
        # half-only kernels (flash, te): the training precision's autocast, else sdpa in fp32
        plan = plan_model_inference(loaded.model, dev, loaded.meta.get("precision"))
        if plan.attention is not None:
            loaded = load_model(
                path, dev, attention=attention or plan.attention, check_backends=True
            )
        if plan.message is not None:
            log.info(plan.message)
        translator = cls(
            loaded.model,
            loaded.tokenizer,
            src_lang=loaded.src_lang,
            tgt_lang=loaded.tgt_lang,
            device=dev,
            languages=loaded.meta,
        )
        translator.autocast = plan.autocast
        return translator

    @property
    def max_source_tokens(self) -> int:
        """Longest source the model accepts (its `max_positions`; an ensemble: the least)."""
        return min(m.config.max_positions for m in self.models)

    # -- decoding -----------------------------------------------------------------------
    def decode_batches(
        self, request: DecodeRequest
    ) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
        """The torch engine: `decode` of the sentences ``request.todo`` in token-budget
        batches (with constraints, batches of sentences that need the same beam:
        `by_beam`). Sampling draws from one generator seeded with ``config.seed`` per call."""
        models = self.models if len(self.models) > 1 else self.model
        with autocast_context(self.device, self.autocast):
            yield from decode_request(self, models, request, self.model.pad_id)


def decode_request(
    translator: BaseTranslator,
    models: StepModel | Sequence[Seq2SeqTransformer],
    request: DecodeRequest,
    pad_id: int,
    part_tokens: int | None = None,
) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
    """`decode` of the sentences ``request.todo`` on `models` (a model, a list of them, or any
    `StepModel`: the onnx engine's) in token-budget batches (with constraints, batches of
    sentences that need the same beam: `by_beam`), on ``translator.device``; sampling draws
    from one generator seeded with ``config.seed`` per call. The torch and onnx engines' loop.

    `part_tokens` (None: no split): a batch of more padded source tokens is decoded in equal
    parts of at most about that many (`litmt.decoding.batching.even_parts`)."""
    config, sources = request.config, request.sources
    sampling = config.effective_method == "sample"
    generator = make_generator(config, translator.device) if sampling else None
    words = translator.word_pieces(request.constraints) if request.constraints else None
    for group, batch in _batches(request, part_tokens):
        idx = [group[j] for j in batch]
        found = decode(
            models,
            padded([sources[i] for i in idx], pad_id).to(translator.device),
            config,
            generator=generator,
            prefixes=request.rows(request.prefixes, idx),
            constraints=request.rows(request.constraints, idx),
            words=words,
        )
        yield idx, found


def by_beam(request: DecodeRequest) -> list[list[int]]:
    """``request.todo`` grouped by the beam each sentence is searched with
    (`litmt.decoding.search.rules.beam_groups`; one group without constraints), so a batch is
    one constrained search."""
    if not request.constraints:
        return [request.todo]
    return [rows for _, rows in beam_groups(request.config, request.constraints, request.todo)]


def _batches(
    request: DecodeRequest, part_tokens: int | None = None
) -> Iterator[tuple[list[int], list[int]]]:
    """(group, a token-budget batch of positions in it) for every group of `by_beam`, a batch
    over `part_tokens` padded tokens in equal parts (`decode_request`)."""
    for group in by_beam(request):
        lengths = [len(request.sources[i]) for i in group]
        for batch in token_batches(lengths, request.max_tokens):
            longest = lengths[batch[0]]  # token_batches: longest first
            if part_tokens is None or len(batch) * longest <= part_tokens:
                yield group, batch
            else:
                for part in even_parts(batch, longest, part_tokens):
                    yield group, part


__all__ = ["Aligned", "NBest", "Translation", "Translator", "by_beam", "decode_request"]
