"""Sentence splitting for the server: a long line is translated sentence by sentence.

A model translates sentences; a request line over its source limit would otherwise be cut
(or refused). `Segmenter.plan` turns a request's texts into the units the model decodes (one
per line, or one per sentence of a line that is split) and `Plan.join` rebuilds each text
from their translations: lines rejoined with ``\\n``, sentences with the whitespace that
followed them in the source. Splitting uses `sentencex` (Wikimedia's maintained,
rule-based segmenter, offline, with language fallbacks); LibreTranslate uses MiniSBD, whose
models are downloaded at first use.

Modes (``split_sentences`` in ``conf/serve.yaml``):

- ``long`` (default): split only a line over the model's source limit;
- ``always``: split every line (what Argos Translate does);
- ``never``: a line over the limit is a 413.

A unit still over the limit after splitting is a 413 naming it, never truncated.

Control characters (but tab) are removed from the units here, as every engine would remove
them, with one warning per request that counts them (`Segmenter.plan`): the engines' own
warning would be one line per unit, thousands from one request.

An inline target-language token at the start of a text (``>>fra<<``: imported multilingual
OPUS-MT models read it as their first source piece; `litmt.data.tokenization.piece_vocab`) is carried to
every unit of the text: each line after the first that does not begin with its own token,
and each sentence of a split line, is decoded as ``">>fra<< " + unit``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from litmt.data.text import strip_control
from litmt.deploy.server.errors import ApiError
from litmt.errors import ConfigError

MODES = ("long", "always", "never")
_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.DOTALL)
_INLINE = re.compile(r"^>>[^<>\s]+<<")  # a leading OPUS-MT language token: >>fra<<
log = logging.getLogger(__name__)


def inline_token(text: str) -> str | None:
    """The ``>>xxx<<`` token `text` starts with (as `litmt.data.tokenization.piece_vocab` reads it), or
    None."""
    m = _INLINE.match(text)
    return m.group(0) if m else None


def _carried(token: str | None, unit: str) -> str:
    """`unit` with the text's inline `token` in front, unless it has a token of its own."""
    if token is None or not unit.strip() or inline_token(unit) is not None:
        return unit  # a blank line stays blank
    return f"{token} {unit}"


def split_sentences(text: str, lang: str) -> list[tuple[str, str, str]]:
    """`text` as ``(leading whitespace, sentence, trailing whitespace)`` triples whose
    concatenation is `text` again.

    >>> split_sentences("A dog runs. It is wet.", "en")
    [('', 'A dog runs.', ' '), ('', 'It is wet.', '')]
    """
    from sentencex import segment  # the serve extra's splitter

    pieces = [p for p in segment(lang, text) if p]
    if not pieces or "".join(pieces) != text:  # never lose a character: the whole line
        pieces = [text]
    return [_EDGES.match(p).groups() for p in pieces]  # type: ignore[union-attr]


@dataclass
class Plan:
    """A request's units to translate and how to rebuild its texts from them."""

    units: list[str] = field(default_factory=list)  # what the model decodes, in order
    # per text, per line: the (leading, trailing) whitespace of each of its units
    shape: list[list[list[tuple[str, str]]]] = field(default_factory=list)

    def join(self, out: list[str]) -> list[str]:
        """Each text rebuilt from `out`, the units' translations (same order)."""
        texts, i = [], 0
        for lines in self.shape:
            rebuilt = []
            for edges in lines:
                rebuilt.append("".join(a + out[i + k] + b for k, (a, b) in enumerate(edges)))
                i += len(edges)
            texts.append("\n".join(rebuilt))
        return texts

    def join_nbest(self, found: list[list[str]]) -> list[list[str]]:
        """Per text, its n-best list: hypothesis j joins each unit's j-th (or last) one.

        `found`: per unit, its hypotheses, best first (at least one each)."""
        depth = max((len(h) for h in found), default=1)
        ranked = [self.join([h[min(j, len(h) - 1)] for h in found]) for j in range(depth)]
        return [[ranked[j][t] for j in range(depth)] for t in range(len(self.shape))]


@dataclass
class Segmenter:
    """Splits request texts into units within the model's source limit.

    Args:
        lang: the source language (sentencex falls back for codes it does not know).
        mode: ``long``, ``always`` or ``never`` (see the module docstring).
        count: subword tokens of each of a list of strings; None (a translator without a
            litmt tokenizer) = no token limits, lines are the units.
        model_limit: the model's source limit in tokens (None = none).
        request_limit: most source tokens in one request (``max_source_tokens``).
    """

    lang: str
    mode: str = "long"
    count: Callable[[list[str]], list[int]] | None = None
    model_limit: int | None = None
    request_limit: int | None = None
    split_lines: int = 0  # lines split into sentences so far (reported by /health)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"split_sentences must be one of {list(MODES)}, got {self.mode!r}")

    def plan(self, texts: list[str]) -> Plan:
        """The units of `texts` (413 `ApiError` over a token limit)."""
        plan = Plan()
        lines = [line for text in texts for line in text.split("\n")]
        counts = self.count(lines) if self.count and lines else [0] * len(lines)
        over = self.model_limit is not None and self.count is not None
        k = 0
        for text in texts:
            per_text = []
            token = inline_token(text)  # >>fra<<: carried to every line and sentence
            for line in text.split("\n"):
                n = counts[k]
                k += 1
                long = over and n > int(self.model_limit)  # type: ignore[arg-type]
                if self.mode == "always" or (self.mode == "long" and long):
                    own = inline_token(line)  # split without it: it is no sentence
                    body = line[len(own) :].lstrip() if own else line
                    parts = split_sentences(body, self.lang)
                    self.split_lines += len(parts) > 1
                    plan.units.extend(_carried(own or token, s) for _, s, _ in parts)
                    per_text.append([(a, b) for a, _, b in parts])
                else:
                    plan.units.append(_carried(token, line))
                    per_text.append([("", "")])
            plan.shape.append(per_text)
        _strip_control(plan.units)
        self._check(plan.units)
        return plan

    def _check(self, units: list[str]) -> None:
        if self.count is None or not units:
            return
        sizes = self.count(units)
        total = sum(sizes)
        if self.request_limit is not None and total > self.request_limit:
            raise ApiError(
                413,
                f"Invalid request: {total} source tokens, over the limit "
                f"(max_source_tokens={self.request_limit})",
            )
        if self.model_limit is not None and max(sizes) > int(self.model_limit):
            what = "a line" if self.mode == "never" else "a sentence"
            hint = "; set split_sentences=long" if self.mode == "never" else ""
            raise ApiError(
                413,
                f"Invalid request: {what} has {max(sizes)} source tokens, over the model's "
                f"limit ({self.model_limit}){hint}",
            )


def _strip_control(units: list[str]) -> None:
    """Remove control characters (but tab) from `units` in place, with one warning for them
    all (the engines then find none to warn about, unit by unit)."""
    removed = touched = 0
    for i, unit in enumerate(units):
        cleaned, n = strip_control(unit)
        if n:
            units[i], removed, touched = cleaned, removed + n, touched + 1
    if removed:
        log.warning(
            "request: removed %d control character(s) from %d of its %d unit(s)",
            removed,
            touched,
            len(units),
        )


def segmenter_for(translator: Any, mode: str, request_limit: int) -> Segmenter:
    """The `Segmenter` of a translator: its source language, tokenizer and source limit."""
    tokenizer = getattr(translator, "tokenizer", None)
    count = None
    if tokenizer is not None:

        def count(strings: list[str]) -> list[int]:
            return [len(ids) for ids in tokenizer.encode_src(strings)]

    limit = getattr(translator, "max_source_tokens", None)
    return Segmenter(
        lang=str(translator.src_lang),
        mode=mode,
        count=count,
        model_limit=None if limit is None else int(limit),
        request_limit=request_limit,
    )
