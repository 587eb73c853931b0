"""What a translator call carries: the request an engine decodes (`DecodeRequest`) and the
hypotheses it gives back as text (`Translation`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from litmt.decoding.config import DecodeConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Translation:
    """One hypothesis of `BaseTranslator.translations`: its text, its length-normalised
    log-prob score, whether it holds every constraint of its sentence (always True without
    constraints), its Pharaoh word alignment ("" unless asked for), its total log-probability
    (its tokens and eos) and its number of target tokens (eos not counted)."""

    text: str
    score: float
    constraints_met: bool = True
    alignment: str = ""
    log_prob: float = 0.0
    length: int = 0


@dataclass(frozen=True)
class DecodeRequest:
    """One `BaseTranslator.search_ids` call, as the engine decodes it.

    Attributes:
        sources: source ids per sentence.
        todo: the sentences to decode (the non-empty sources), indices into `sources`.
        config: the decoding settings.
        max_tokens: padded source tokens per batch.
        prefixes, constraints: per sentence (indexed as `sources`), or None.
    """

    sources: Sequence[Sequence[int]]
    todo: list[int]
    config: DecodeConfig
    max_tokens: int
    prefixes: Sequence[Sequence[int]] | None
    constraints: Sequence[Sequence[Sequence[int]]] | None

    @staticmethod
    def rows(values: Sequence[T] | None, idx: Sequence[int]) -> list[T] | None:
        """``values`` of the sentences `idx` (None stays None)."""
        return None if values is None else [values[i] for i in idx]


__all__ = ["DecodeRequest", "Translation"]
