"""What every engine's translator shares: text in, text out (`BaseTranslator`).

The torch engine (`litmt.decoding.translator.Translator`) and the CTranslate2 engine
(`litmt.deploy.engines.ct2.CT2Translator`) differ only in how they load and decode a batch
(`decode_batches`, `check_request`); the rest is here, so every option means the same on both.
Word alignments need a torch model (its cross-attention): the CTranslate2 engine refuses them.

Text lines are read under `litmt.data.text`'s one policy (`read_lines`, replace mode: invalid
bytes become U+FFFD with a warning; one output line per input line).

Input hygiene (never crashes, never shifts lines): control characters other than tab are
removed with a warning (`litmt.data.text.clean_line`); empty or whitespace-only inputs give ""
without running the model; sources longer than the model's `max_positions` are truncated
with a warning. Warnings go to the ``litmt`` logger (the scripts print them on stderr as
``warning: ...``).

Steering (`litmt.decoding.steering`): ``translate(sentences, prefixes=[...],
constraints=[[...], ...])`` gives each sentence a target prefix (its output begins with it)
and terminology constraints (target phrases its output must contain); ``search_ids`` takes
them as target ids; ``translations`` returns each hypothesis with ``constraints_met``
(False: the best one, when none within the budget met them all). An empty source gives its
prefix (score 0) without running the model, whatever its constraints (flagged unmet when it
has any).

Directions (`litmt.decoding.languages`): ``translate(sentences, src_lang="en", tgt_lang="fr")``
routes to a multilingual model's language token (a one-pair model refuses any other pair);
``allow_zero_shot=True`` lets a never-trained direction through, reported as zero-shot.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from tqdm import tqdm

from litmt.data.text import clean_line, strip_line_end
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.decoding.analysis.alignment import AlignConfig, align_ids, pharaoh
from litmt.decoding.batching import check_max_tokens, token_batches
from litmt.decoding.config import DecodeConfig, decoding_options
from litmt.decoding.languages import Languages, Route
from litmt.decoding.requests import DecodeRequest, Translation
from litmt.decoding.search.constraint_tracker import WordPieces
from litmt.decoding.search.rules import Hypothesis, budget_floor
from litmt.decoding.steering import encode_steering, log_raised_beams, word_pieces
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.runtime.precision import autocast_context

log = logging.getLogger(__name__)

NBest = list[tuple[str, float]]
Aligned = list[tuple[str, float, str]]  # (text, score, Pharaoh alignment)


class BaseTranslator:
    """Text in, text out over an engine's `decode_batches` (module docstring).

    Attributes (set by the engine): ``tokenizer``, ``languages`` (`Languages`),
    ``default_config`` (the `DecodeConfig` that options override), ``device``.
    """

    tokenizer: Tokenizer
    languages: Languages
    default_config: DecodeConfig
    device: torch.device
    model: Seq2SeqTransformer | None  # None: the engine has no torch model (no alignments)
    models: list[Seq2SeqTransformer]
    autocast: torch.dtype | None

    @property
    def max_source_tokens(self) -> int:
        """Longest source the model accepts."""
        raise NotImplementedError

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
        """The prefixes and constraints of `n` sentences as target ids
        (`litmt.decoding.steering.encode_steering`); None where absent.

        Raises:
            ConfigError: a malformed prefix or constraint (one line).
        """
        return encode_steering(self.tokenizer, n, prefixes, constraints)

    def word_pieces(
        self, constraints: Sequence[Sequence[Sequence[int]]] | None = None
    ) -> WordPieces:
        """The target pieces that continue a word, the glue pieces and the glued forms of
        `constraints` (`litmt.decoding.steering.word_pieces`)."""
        return word_pieces(self.tokenizer, constraints)

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

        Every engine's front: it checks the options and the steering (`check_request`), gives
        an empty source ``[Hypothesis(prefix, 0.0, 0.0)]`` without running the model, and
        shows the progress; the engine decodes the rest (`decode_batches`).

        Args:
            sources: source ids per sentence.
            config: decoding settings (None = the engine's defaults); keyword `options`
                (DecodeConfig fields, e.g. ``beam_size=4``; None = keep) override it.
            max_tokens: padded source tokens per batch.
            progress: a tqdm bar on stderr.
            prefixes: per sentence, target ids its output starts with (`encode_steering`).
            constraints: per sentence, target id sequences its output must contain.
        """
        config = decoding_options(config or self.default_config, options)
        check_max_tokens(max_tokens)
        todo = [i for i, ids in enumerate(sources) if len(ids) > 0]
        request = DecodeRequest(sources, todo, config, max_tokens, prefixes, constraints)
        self.check_request(request)  # refused before any decoding
        if constraints is not None and config.method != "sample":
            log_raised_beams(config.beam_size if config.method == "beam" else 1, constraints)
        results: list[list[Hypothesis]] = [  # an empty source holds no constraint
            [Hypothesis(list(prefixes[i]) if prefixes else [], 0.0, 0.0, not constraints[i])]
            if constraints
            else [Hypothesis(list(prefixes[i]) if prefixes else [], 0.0, 0.0)]
            for i in range(len(sources))
        ]
        with tqdm(total=len(sources), disable=not progress, file=sys.stderr, unit="sent") as bar:
            bar.update(len(sources) - len(todo))
            for idx, found in self.decode_batches(request):
                for i, hyps in zip(idx, found, strict=True):
                    results[i] = hyps
                bar.update(len(idx))
        return results

    def check_request(self, request: DecodeRequest) -> None:
        """Refuse what cannot be decoded, before any decoding: here a prefix and constraints
        longer than the model's output (`budget_floor`); an engine adds its own refusals.

        Raises:
            ConfigError: one line naming the sentence.
        """
        if request.prefixes is not None or request.constraints is not None:
            budget_floor(self.max_source_tokens, request.prefixes, request.constraints)

    def decode_batches(
        self, request: DecodeRequest
    ) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
        """The engine's decoding of the sentences ``request.todo``: (their indices into the
        sources, their hypotheses) per batch of at most ``request.max_tokens`` padded source
        tokens."""
        raise NotImplementedError

    def alignments(
        self,
        sources: Sequence[Sequence[int]],
        found: Sequence[Sequence[Hypothesis]],
        config: AlignConfig | None = None,
        *,
        max_tokens: int = 4096,
    ) -> list[list[str]]:
        """Pharaoh word alignments (`litmt.decoding.analysis.alignment`) of every hypothesis of every source.

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

    def translations(
        self,
        sentences: Sequence[str],
        config: DecodeConfig | None = None,
        *,
        max_tokens: int = 4096,
        progress: bool = False,
        first_line: int = 1,
        alignment: AlignConfig | None = None,
        prefixes: Sequence[str | None] | None = None,
        constraints: Sequence[Sequence[str] | None] | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        allow_zero_shot: bool = False,
        **options: Any,
    ) -> list[list[Translation]]:
        """Translate sentences (any order of lengths; output order = input order).

        Args:
            sentences: source texts.
            config: decoding settings (`DecodeConfig`; None = the defaults).
            max_tokens: padded source tokens per batch.
            progress: show a tqdm bar on stderr.
            first_line: number of the first sentence in warnings ("line N").
            alignment: also give Pharaoh word alignments built this way.
            prefixes: one string (or None) per sentence: its translation begins with it.
            constraints: one list of target phrases (or None) per sentence: its translation
                contains each (constrained beam search; not on the ct2 engine).
            src_lang, tgt_lang: the direction (None = the model's only one); a multilingual
                model routes to its language token (`litmt.decoding.languages`).
            allow_zero_shot: let a direction the model never trained on through (a warning).
            options: DecodeConfig fields overriding `config` (e.g. ``beam_size=4``,
                ``method="sample", n_best=3``).

        Returns:
            Per sentence, its `Translation` list best first (``n_best`` of them, or fewer;
            one for greedy); an empty input gives ``[Translation("", 0.0)]``. With
            constraints only translations meeting them all, or, where none does within the
            budget, the best one with ``constraints_met=False``.
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
        found = self.search_ids(
            ids,
            decoding_options(config or self.default_config, options),
            max_tokens=max_tokens,
            progress=progress,
            prefixes=prefix_ids,
            constraints=constraint_ids,
        )
        links = [["" for _ in hyps] for hyps in found]
        if alignment is not None and found:
            links = self.alignments(ids, found, alignment, max_tokens=max_tokens)
            links = [[route.untagged_alignment(a) for a in row] for row in links]
        out: list[list[Translation]] = []
        for hyps, link in zip(found, links, strict=True):
            texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
            out.append(
                [
                    Translation(t, h.score, h.constraints_met, a, h.log_prob, len(h.tokens))
                    for t, h, a in zip(texts, hyps, link, strict=True)
                ]
            )
        return out

    def translate(
        self,
        sentences: Sequence[str],
        config: DecodeConfig | None = None,
        *,
        return_scores: bool = False,
        alignment: AlignConfig | None = None,
        **options: Any,
    ) -> list[str] | list[NBest] | list[Aligned]:
        """Translate sentences: `translations` (its arguments; `options` are its keyword
        arguments and DecodeConfig fields) as plain text.

        A sentence whose constraints could not all be met within the budget gives its best
        hypothesis, with one warning line per call (`translations` flags it).

        Returns:
            With ``n_best == 1``, not ``return_scores`` and no `alignment`: one string per
            sentence. Otherwise, per sentence, a best-first list of (text, length-normalised
            log-prob score), or (text, score, alignment) with `alignment`; an empty input
            gives ``[("", 0.0)]``.
        """
        decoding = {k: v for k, v in options.items() if k in DecodeConfig.__dataclass_fields__}
        config = decoding_options(config or self.default_config, decoding)
        keywords = {k: v for k, v in options.items() if k not in decoding}
        found = self.translations(sentences, config, alignment=alignment, **keywords)
        missed = sum(1 for row in found if row and not row[0].constraints_met)
        if missed:
            log.warning(
                "%d of %d sentence(s) could not meet all their constraints within the output "
                "budget: their best hypotheses are returned without them",
                missed,
                len(found),
            )
        if alignment is not None:
            return [[(t.text, t.score, t.alignment) for t in row] for row in found]
        if config.n_best == 1 and not return_scores:
            return [row[0].text for row in found]
        return [[(t.text, t.score) for t in row] for row in found]

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


__all__ = ["Aligned", "BaseTranslator", "DecodeRequest", "NBest", "Translation"]
