"""Translate text with a trained checkpoint: the `Translator` API and the `translate(cfg)` job.

>>> from litmt import Translator
>>> Translator.from_checkpoint("model.ckpt").translate(["A man is walking."])
['Ein Mann geht.']

Text lines are read under `litmt.data.text`'s one policy (`read_lines`, replace mode: invalid
bytes become U+FFFD with a warning; one output line per input line).

Input hygiene (never crashes, never shifts lines): control characters other than tab are
removed with a warning (`litmt.data.text.clean_line`); empty or whitespace-only inputs give ""
without running the model; sources longer than the model's `max_positions` are truncated
with a warning. Warnings go to
the ``litmt`` logger (the scripts print them on stderr as ``warning: ...``).

Steering (`litmt.decoding.steering`): ``translate(sentences, prefixes=[...],
constraints=[[...], ...])`` gives each sentence a target prefix (its output begins with it)
and terminology constraints (target phrases its output must contain); ``search_ids`` takes
them as target ids. An empty source gives its prefix (score 0) without running the model,
whatever its constraints.

Directions (`litmt.decoding.languages`): ``translate(sentences, src_lang="en", tgt_lang="fr")``
routes to a multilingual model's language token (a one-pair model refuses any other pair);
``allow_zero_shot=True`` lets a never-trained direction through, reported as zero-shot.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from litmt.checkpoint.compat import tokenizer_difference
from litmt.checkpoint.load import load_model, resolve_device
from litmt.data.text import clean_line, strip_line_end
from litmt.data.tokenizer import Tokenizer
from litmt.decoding.alignment import AlignConfig, align_ids, pharaoh
from litmt.decoding.config import DecodeConfig, decoding_options
from litmt.decoding.dispatch import decode
from litmt.decoding.languages import Languages, Route
from litmt.decoding.sampling_search import make_generator
from litmt.decoding.search import Hypothesis
from litmt.decoding.steering import budget_floor, check_constraints, check_prefixes
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.runtime.precision import autocast_context, plan_model_inference

log = logging.getLogger(__name__)

NBest = list[tuple[str, float]]
Aligned = list[tuple[str, float, str]]  # (text, score, Pharaoh alignment)


def check_max_tokens(max_tokens: int) -> None:
    """Refuse a batch budget below one token (every engine's `search_ids`, `token_batches`).

    Raises:
        ConfigError: `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group indices into batches of at most `max_tokens` padded source tokens.

    Sentences are sorted longest first (so similar lengths share a batch and an
    out-of-memory shows up at once); a sentence longer than `max_tokens` gets its own batch.

    Returns:
        Lists of indices into `lengths`.
    """
    check_max_tokens(max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class Translator:
    """A model (or an ensemble) + tokenizer ready to translate plain text.

    Args:
        model: a `Seq2SeqTransformer`, or a list of them decoded as an ensemble
            (`litmt.decoding.ensemble`); put in eval mode and moved to `device`. ``self.model`` is
            the first (the attention explorer and forced decoding use it).
        tokenizer: its `Tokenizer`.
        src_lang, tgt_lang: language codes from the checkpoint (a multilingual model: its
            first direction).
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
            CheckpointError: missing/corrupt checkpoint. BackendError: the checkpoint's
            kernel cannot run here (pass `attention`). ConfigError: ensemble members with
            different tokenizers.
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

    # -- directions -----------------------------------------------------------------------
    def languages_meta(self) -> dict[str, Any]:
        """The model's directions as metadata (`Languages.from_meta` reads it back)."""
        lang = self.languages
        meta: dict[str, Any] = {"src_lang": lang.src_lang, "tgt_lang": lang.tgt_lang}
        if lang.directions:
            meta["directions"] = [d.name for d in lang.directions]
            meta["tag_placement"] = lang.placement
        return meta

    def route(
        self,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        *,
        allow_zero_shot: bool = False,
    ) -> Route:
        """The route of a requested direction (`litmt.decoding.languages.Languages.route`).

        Raises:
            ConfigError: a direction the model does not know (one line).
        """
        return self.languages.route(
            self.tokenizer, src_lang, tgt_lang, allow_zero_shot=allow_zero_shot
        )

    # -- preprocessing ------------------------------------------------------------------
    @property
    def max_source_tokens(self) -> int:
        """Longest source the model accepts (its `max_positions`; an ensemble: the least)."""
        return min(m.config.max_positions for m in self.models)

    def prepare(self, text: str, where: str = "input") -> list[int]:
        """Clean and encode one source sentence; [] for empty/whitespace input.

        Control characters (except tab) are removed and over-long sources truncated to
        `max_source_tokens`, each with a warning naming `where` (e.g. "line 3").
        """
        cleaned = clean_line(text, where)
        if not cleaned.strip():
            return []
        ids = self.tokenizer.encode_src([cleaned])[0]
        if len(ids) > self.max_source_tokens:
            log.warning(
                "%s: %d subword tokens, truncated to the model's maximum of %d",
                where,
                len(ids),
                self.max_source_tokens,
            )
            ids = ids[: self.max_source_tokens]
        return ids

    def encode_steering(
        self, n: int, prefixes: Any = None, constraints: Any = None
    ) -> tuple[list[list[int]] | None, list[list[list[int]]] | None]:
        """Check (`litmt.decoding.steering`) and encode the prefixes and constraints of `n`
        sentences with the target tokenizer: (prefix ids, constraint ids), None where absent.

        Raises:
            ConfigError: a malformed prefix or constraint (one line).
        """
        prefix_ids = None
        if prefixes is not None:
            texts = check_prefixes(prefixes, n)
            encoded = self.tokenizer.encode_tgt([t or "" for t in texts]) if n else []
            prefix_ids = [ids if t else [] for t, ids in zip(texts, encoded, strict=True)]
        constraint_ids = None
        if constraints is not None:
            phrases = check_constraints(constraints, n)
            constraint_ids = [self.tokenizer.encode_tgt(p) if p else [] for p in phrases]
            for i, ids in enumerate(constraint_ids):
                if any(not c for c in ids):
                    raise ConfigError(
                        f"a constraint of sentence {i + 1} encodes to no target tokens"
                    )
        return prefix_ids, constraint_ids

    def word_continuation(self) -> torch.Tensor:
        """(V,) bool: target pieces that continue the previous word (no leading ``▁``, a
        letter or digit first), which may not follow a completed constraint."""
        pieces = self.tokenizer.tgt_pieces(range(self.tokenizer.tgt_vocab_size))
        mask = [not p.startswith("\u2581") and p[:1].isalnum() for p in pieces]
        return torch.tensor(mask, dtype=torch.bool)

    # -- decoding -----------------------------------------------------------------------
    def search_ids(
        self,
        sources: Sequence[Sequence[int]],
        config: DecodeConfig | None = None,
        *,
        max_tokens: int = 4096,
        progress: bool = False,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
        **options: Any,
    ) -> list[list[Hypothesis]]:
        """Decode prepared source ids in token-budget batches, returning results in input order.

        Args:
            sources: source ids per sentence.
            config: decoding settings (None = `DecodeConfig`'s defaults); keyword `options`
                (DecodeConfig fields, e.g. ``beam_size=4``; None = keep) override it.
            max_tokens: padded source tokens per batch.
            progress: a tqdm bar on stderr.
            prefixes: per sentence, target ids its output starts with (`encode_steering`).
            constraints: per sentence, target id sequences its output must contain.

        Empty sources give ``[Hypothesis(prefix, 0.0, 0.0)]`` without running the model.
        Sampling draws from one generator seeded with ``config.seed`` per call.
        """
        config = decoding_options(config or self.default_config, options)
        if prefixes is not None or constraints is not None:  # refused before any decoding
            budget_floor(self.max_source_tokens, prefixes, constraints)
        results: list[list[Hypothesis]] = [
            [Hypothesis(list(prefixes[i]) if prefixes else [], 0.0, 0.0)]
            for i in range(len(sources))
        ]
        todo = [i for i, ids in enumerate(sources) if len(ids) > 0]
        pad = self.model.pad_id
        models = self.models if len(self.models) > 1 else self.model
        sampling = config.effective_method == "sample"
        generator = make_generator(config, self.device) if sampling else None
        with (
            tqdm(total=len(sources), disable=not progress, file=sys.stderr, unit="sent") as bar,
            autocast_context(self.device, self.autocast),
        ):
            bar.update(len(sources) - len(todo))
            for batch in token_batches([len(sources[i]) for i in todo], max_tokens):
                idx = [todo[j] for j in batch]
                width = max(len(sources[i]) for i in idx)
                src = torch.full((len(idx), width), pad, dtype=torch.long)  # (B, S)
                for row, i in enumerate(idx):
                    src[row, : len(sources[i])] = torch.as_tensor(sources[i])
                found = decode(
                    models,
                    src.to(self.device),
                    config,
                    generator=generator,
                    prefixes=None if prefixes is None else [prefixes[i] for i in idx],
                    constraints=None if constraints is None else [constraints[i] for i in idx],
                    word_continuation=self.word_continuation() if constraints else None,
                )
                for i, hyps in zip(idx, found, strict=True):
                    results[i] = hyps
                bar.update(len(idx))
        return results

    def alignments(
        self,
        sources: Sequence[Sequence[int]],
        found: Sequence[Sequence[Hypothesis]],
        config: AlignConfig | None = None,
        *,
        max_tokens: int = 4096,
    ) -> list[list[str]]:
        """Pharaoh word alignments (`litmt.decoding.alignment`) of every hypothesis of every source.

        Returns:
            Per source, one alignment string per hypothesis ("" for an empty source or
            hypothesis).
        """
        if self.model is None:
            raise ConfigError("alignments need the torch engine (the model's cross-attention)")
        out = [["" for _ in hyps] for hyps in found]
        pairs = [(i, j) for i, hyps in enumerate(found) for j, h in enumerate(hyps) if sources[i]]
        lengths = [max(len(sources[i]), len(found[i][j].tokens) + 1) for i, j in pairs]
        tags = list(getattr(self.tokenizer, "src_tags", {}))
        with autocast_context(self.device, self.autocast):
            for batch in token_batches(lengths, max_tokens) if pairs else []:
                chosen = [pairs[k] for k in batch]
                src = [sources[i] for i, _ in chosen]
                tgt = [found[i][j].tokens for i, j in chosen]
                links = align_ids(
                    self.models,
                    src,
                    tgt,
                    [self.tokenizer.src_pieces(s) for s in src],
                    [self.tokenizer.tgt_pieces(t) for t in tgt],
                    config,
                    tags=tags,
                )
                for (i, j), link in zip(chosen, links, strict=True):
                    out[i][j] = pharaoh(link)
        return out

    def translate(
        self,
        sentences: Sequence[str],
        config: DecodeConfig | None = None,
        *,
        max_tokens: int = 4096,
        return_scores: bool = False,
        progress: bool = False,
        first_line: int = 1,
        alignment: AlignConfig | None = None,
        prefixes: Sequence[str | None] | None = None,
        constraints: Sequence[Sequence[str] | None] | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        allow_zero_shot: bool = False,
        **options: Any,
    ) -> list[str] | list[NBest] | list[Aligned]:
        """Translate sentences (any order of lengths; output order = input order).

        Args:
            sentences: source texts.
            config: decoding settings (`DecodeConfig`; None = the defaults).
            max_tokens: padded source tokens per batch.
            return_scores: return (text, score) pairs.
            progress: show a tqdm bar on stderr.
            first_line: number of the first sentence in warnings ("line N").
            alignment: also return Pharaoh word alignments built this way.
            prefixes: one string (or None) per sentence: its translation begins with it.
            constraints: one list of target phrases (or None) per sentence: its translation
                contains each (constrained beam search; not on the ct2 engine).
            src_lang, tgt_lang: the direction (None = the model's only one); a multilingual
                model routes to its language token (`litmt.decoding.languages`).
            allow_zero_shot: let a direction the model never trained on through (a warning).
            options: DecodeConfig fields overriding `config` (e.g. ``beam_size=4``,
                ``method="sample", n_best=3``).

        Returns:
            With ``n_best == 1``, not ``return_scores`` and no `alignment`: one string per
            sentence. Otherwise, per sentence, a best-first list of (text, length-normalised
            log-prob score), or (text, score, alignment) with `alignment`; an empty input
            gives ``[("", 0.0)]``.
        """
        if isinstance(sentences, str):
            raise ConfigError("translate() takes a list of sentences, not one string")
        route = self.route(src_lang, tgt_lang, allow_zero_shot=allow_zero_shot)
        prefix_ids, constraint_ids = self.encode_steering(len(sentences), prefixes, constraints)
        ids = [self.prepare(s, f"line {first_line + i}") for i, s in enumerate(sentences)]
        ids = [route.source_ids(x, self.max_source_tokens) for x in ids]
        if route.tag_id is not None and route.placement == "target":
            given = prefix_ids or [[] for _ in sentences]
            prefix_ids = [route.prefix_ids(p) or [] for p in given]
        config = decoding_options(config or self.default_config, options)
        found = self.search_ids(
            ids,
            config,
            max_tokens=max_tokens,
            progress=progress,
            prefixes=prefix_ids,
            constraints=constraint_ids,
        )
        if not found:
            return []
        if alignment is not None:
            links = self.alignments(ids, found, alignment, max_tokens=max_tokens)
            links = [[route.untagged_alignment(a) for a in row] for row in links]
            aligned: list[Aligned] = []
            for hyps, link in zip(found, links, strict=True):
                texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
                aligned.append([(t, h.score, a) for t, h, a in zip(texts, hyps, link, strict=True)])
            return aligned
        if config.n_best == 1 and not return_scores:
            return self.tokenizer.decode_tgt([hyps[0].tokens for hyps in found])
        out: list[NBest] = []
        for hyps in found:
            texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
            out.append([(t, h.score) for t, h in zip(texts, hyps, strict=True)])
        return out

    def translate_stream(
        self,
        lines: Iterable[str],
        *,
        chunk_lines: int = 256,
        max_tokens: int = 4096,
        **options: Any,
    ) -> Iterator[str | NBest]:
        """Translate an iterable of lines lazily, one result per line, in order.

        Lines are read in chunks of at most `chunk_lines` lines or `max_tokens` source
        tokens, so long inputs stream with bounded memory. Trailing newlines are stripped.

        Args:
            lines: e.g. a text file object.
            chunk_lines: lines per chunk (1 answers each line as soon as it is read).
            max_tokens: batch budget, also used to cut chunks.
            options: `translate` options (beam_size, n_best, return_scores, ...).
        """
        if chunk_lines < 1:
            raise ConfigError(f"chunk_lines must be positive, got {chunk_lines}")
        chunk: list[str] = []
        tokens, first = 0, 1
        for line in lines:
            line = strip_line_end(line)
            chunk.append(line)
            tokens += len(line.split()) + 1  # cheap estimate; exact batching comes later
            if len(chunk) >= chunk_lines or tokens >= max_tokens:
                yield from self.translate(chunk, max_tokens=max_tokens, first_line=first, **options)
                first += len(chunk)
                chunk, tokens = [], 0
        if chunk:
            yield from self.translate(chunk, max_tokens=max_tokens, first_line=first, **options)


# -- the `scripts/translate.py` job ------------------------------------------------------


__all__ = ["Aligned", "NBest", "Translator", "check_max_tokens", "token_batches"]
