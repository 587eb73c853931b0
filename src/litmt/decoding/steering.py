"""Output the user steers: a target prefix and terminology constraints, checked and encoded.

Every engine and entry point (`Translator.translate`, ``translate.py input=FILE.jsonl``, the
server's ``prefix``/``constraints`` fields) takes them in the same form and checks them here,
so a bad one is the same one-line `ConfigError` everywhere (a 400 on the server):

- ``prefixes``: one string or None per sentence. The output begins with it, tokenised as the
  model tokenises target text (the target sentencepiece model, the string as given): "Ein
  Mann" gives ``▁Ein ▁Mann`` and the model continues after it, with a new word (``▁...``) or
  by extending the last one ("Ein Ma" may become "Ein Mann"). The text of the output starts
  with the prefix as sentencepiece normalises it (e.g. runs of spaces become one).
- ``constraints``: one list of strings (possibly empty) or None per sentence; each string is
  a target phrase that must appear in the output, tokenised the same way (a phrase is a
  word sequence: ``"Hund"`` is ``▁Hund``, the form a word takes inside a sentence).

The length budget: a sentence must be able to hold its prefix and every constraint, so its
output budget (`litmt.decoding.search_rules.output_budgets`) is raised to at least
``len(prefix) + sum(len(constraint))`` tokens (`budget_floor`); more than the model's
``max_positions - 1`` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from litmt.data.tokenizer import Tokenizer
from litmt.errors import ConfigError

Ids = list[int]


def _where(i: int, n: int) -> str:
    return "" if n == 1 else f" (sentence {i + 1})"


def check_prefixes(prefixes: Any, n: int) -> list[str | None]:
    """`prefixes` as one string or None per sentence (n of them).

    Raises:
        ConfigError: not a list of n strings/None.
    """
    if isinstance(prefixes, str) or not isinstance(prefixes, Sequence):
        raise ConfigError(
            f"prefixes must be a list with one string (or null) per sentence, got "
            f"{type(prefixes).__name__}"
        )
    if len(prefixes) != n:
        raise ConfigError(f"prefixes has {len(prefixes)} entries for {n} sentences")
    for i, p in enumerate(prefixes):
        if p is not None and not isinstance(p, str):
            raise ConfigError(f"a prefix must be a string{_where(i, n)}, got {type(p).__name__}")
    return list(prefixes)


def check_constraints(constraints: Any, n: int) -> list[list[str]]:
    """`constraints` as one list of non-empty strings per sentence (n of them; None = []).

    Raises:
        ConfigError: not a list of n lists of strings, or an empty/blank constraint.
    """
    if isinstance(constraints, str) or not isinstance(constraints, Sequence):
        raise ConfigError(
            f"constraints must be a list with one list of strings per sentence, got "
            f"{type(constraints).__name__}"
        )
    if len(constraints) != n:
        raise ConfigError(f"constraints has {len(constraints)} entries for {n} sentences")
    out: list[list[str]] = []
    for i, phrases in enumerate(constraints):
        if phrases is None:
            out.append([])
            continue
        if isinstance(phrases, str) or not isinstance(phrases, Sequence):
            raise ConfigError(
                f"the constraints of a sentence must be a list of strings{_where(i, n)}, got "
                f"{type(phrases).__name__}"
            )
        for c in phrases:
            if not isinstance(c, str):
                raise ConfigError(
                    f"a constraint must be a string{_where(i, n)}, got {type(c).__name__}"
                )
            if not c.strip():
                raise ConfigError(f"a constraint must not be empty{_where(i, n)}")
        out.append(list(phrases))
    return out


def budget_floor(
    max_positions: int,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
) -> list[int]:
    """Per sentence, the tokens its output must be able to hold: its prefix plus all its
    constraints (the floor of `litmt.decoding.search_rules.output_budgets`).

    Raises:
        ConfigError: a sentence needs more than the model's ``max_positions - 1`` tokens.
    """
    n = len(prefixes) if prefixes is not None else len(constraints or [])
    floor = [0] * n
    for i in range(n):
        if prefixes is not None:
            floor[i] += len(prefixes[i])
        if constraints is not None:
            floor[i] += sum(len(c) for c in constraints[i])
    limit = max_positions - 1
    for i, f in enumerate(floor):
        if f > limit:
            raise ConfigError(
                f"the prefix and constraints{_where(i, n)} need {f} target tokens, more than "
                f"the model's maximum output of {limit}; shorten them"
            )
    return floor


def encode_steering(
    tokenizer: Tokenizer, n: int, prefixes: Any = None, constraints: Any = None
) -> tuple[list[list[int]] | None, list[list[list[int]]] | None]:
    """Check (`check_prefixes`, `check_constraints`) and encode the prefixes and constraints
    of `n` sentences with the target tokenizer: (prefix ids, constraint ids), None where absent.

    Raises:
        ConfigError: a malformed prefix or constraint (one line).
    """
    prefix_ids = None
    if prefixes is not None:
        texts = check_prefixes(prefixes, n)
        encoded = tokenizer.encode_tgt([t or "" for t in texts]) if n else []
        prefix_ids = [ids if t else [] for t, ids in zip(texts, encoded, strict=True)]
    constraint_ids = None
    if constraints is not None:
        phrases = check_constraints(constraints, n)
        constraint_ids = [tokenizer.encode_tgt(p) if p else [] for p in phrases]
        for i, ids in enumerate(constraint_ids):
            if any(not c for c in ids):
                raise ConfigError(f"a constraint of sentence {i + 1} encodes to no target tokens")
    return prefix_ids, constraint_ids


def word_continuation(tokenizer: Tokenizer) -> torch.Tensor:
    """(V,) bool: target pieces that continue the previous word (no leading ``▁``, a letter or
    digit first), which may not follow a completed constraint (`litmt.decoding.constraints`)."""
    pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    mask = [not p.startswith("\u2581") and p[:1].isalnum() for p in pieces]
    return torch.tensor(mask, dtype=torch.bool)


__all__ = [
    "Ids",
    "budget_floor",
    "check_constraints",
    "check_prefixes",
    "encode_steering",
    "word_continuation",
]
