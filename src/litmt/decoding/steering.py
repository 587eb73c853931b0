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

Unknown pieces (`check_known_pieces`): a prefix or constraint with characters the target
vocabulary lacks would become ``<unk>`` (and vanish from an imported Marian model's output),
so it is refused with one line naming the phrase and the characters. A tokenizer with byte
fallback has no unknown characters; there the phrase must decode back to itself (as
sentencepiece normalises it) instead.

The length budget: a sentence must be able to hold its prefix and every constraint, so its
output budget (`litmt.decoding.search.rules.output_budgets`) is raised to at least
``len(prefix) + sum(len(constraint))`` tokens (`litmt.decoding.search.rules.budget_floor`); more than the model's
``max_positions - 1`` is refused.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from typing import Any

import sentencepiece as spm
import torch

from litmt.data.tokenization.segmentation import model_proto
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from litmt.decoding.search.constraint_tracker import WordPieces
from litmt.decoding.search.rules import constrained_beam
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

# A word follows these without its space: opening brackets and quotes (Unicode Ps, Pi), the
# straight quotes and apostrophes (l'homme), ¿ ¡, and a lone ▁ (the space itself).
GLUE_CATEGORIES = ("Ps", "Pi")
GLUE_CHARS = "'\u2019\"\u00bf\u00a1\u2581"

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


def _normalised(tokenizer: Tokenizer, text: str) -> str:
    """`text` as the target sentencepiece model normalises it, as decoded text."""
    return tokenizer.tgt.normalize(text).replace("\u2581", " ").strip()


def _lost_characters(tokenizer: Tokenizer, text: str) -> list[str]:
    """The characters of `text` (each once, in order) that do not survive encoding alone."""
    out: list[str] = []
    for c in dict.fromkeys(text):
        if c.isspace():
            continue
        ids = tokenizer.encode_tgt([c])[0]
        if UNK_ID in ids or tokenizer.decode_tgt([ids])[0] != _normalised(tokenizer, c):
            out.append(c)
    return out


def byte_fallback(tokenizer: Tokenizer) -> bool:
    """The target sentencepiece model spells unknown characters as bytes (no ``<unk>``)."""
    return bool(model_proto(tokenizer.tgt.serialized_model_proto()).trainer_spec.byte_fallback)


def check_known_pieces(tokenizer: Tokenizer, text: str, ids: Sequence[int], what: str) -> None:
    """Refuse a target phrase (a prefix or a constraint) whose ids `ids` (its encoding with
    `tokenizer`) lose some of its characters: ids holding ``<unk>``, or, with a byte-fallback
    tokenizer (`byte_fallback`), ids that do not decode back to `text` as sentencepiece
    normalises it. Every engine checks its steering here (`encode_steering`).

    Args:
        tokenizer: the model's tokenizer (a litmt one or an imported Marian piece vocabulary).
        text: the phrase as the user wrote it.
        ids: its target ids, ``tokenizer.encode_tgt([text])[0]``.
        what: names the phrase in the message, e.g. ``"constraint (sentence 2)"``.

    Raises:
        ConfigError: a `LitmtError`, so the scripts print it and exit 2 and the server answers
            400; one line naming the phrase and the characters, e.g. ``the constraint '5 €'
            has characters the model's target vocabulary lacks: '€'; ...``.
    """
    decoded = tokenizer.decode_tgt([ids])[0]
    if decoded == _normalised(tokenizer, text):
        return
    if UNK_ID in ids:
        lost = _lost_characters(tokenizer, text)
        if lost:
            found = (
                f"has characters the model's target vocabulary lacks: {', '.join(map(repr, lost))}"
            )
        else:  # every character alone is known, but a piece of the phrase is not
            pieces = tokenizer.tgt.encode(text, out_type=str)
            unknown = [p for p, i in zip(pieces, ids, strict=False) if i == UNK_ID] or pieces
            found = (
                f"has pieces the model's target vocabulary lacks: {', '.join(map(repr, unknown))}"
            )
        raise ConfigError(
            f"the {what} {text!r} {found}; they would be lost (<unk>): remove or replace them"
        )
    if byte_fallback(tokenizer):
        raise ConfigError(
            f"the {what} {text!r} does not decode back to itself (the model's tokenizer gives "
            f"{decoded!r}): remove or replace the characters that differ"
        )


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
        for i, (t, ids) in enumerate(zip(texts, prefix_ids, strict=True)):
            if t:
                check_known_pieces(tokenizer, t, ids, f"prefix{_where(i, n)}")
    constraint_ids = None
    if constraints is not None:
        phrases = check_constraints(constraints, n)
        constraint_ids = [tokenizer.encode_tgt(p) if p else [] for p in phrases]
        for i, ids in enumerate(constraint_ids):
            if any(not c for c in ids):
                raise ConfigError(f"a constraint of sentence {i + 1} encodes to no target tokens")
            for text, c in zip(phrases[i], ids, strict=True):
                check_known_pieces(tokenizer, text, c, f"constraint{_where(i, n)}")
    return prefix_ids, constraint_ids


def log_raised_beams(beam_size: int, constraints: Sequence[Sequence[Sequence[int]]]) -> None:
    """One info line when `constrained_beam` raises the beam of any of these sentences."""
    beams = [constrained_beam(beam_size, c) for c in constraints if c]
    raised = [k for k in beams if k > beam_size]
    if raised:
        log.info(
            "beam size %d is smaller than the constraint pieces + 1 of %d sentence(s): their "
            "beams are raised to fit (up to %d)",
            beam_size,
            len(raised),
            max(raised),
        )


def word_continuation(tokenizer: Tokenizer) -> torch.Tensor:
    """(V,) bool: target pieces that continue the previous word (no leading ``▁``, a letter or
    digit first), which may not follow a completed constraint (`litmt.decoding.search.constrained`)."""
    pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    mask = [not p.startswith("\u2581") and p[:1].isalnum() for p in pieces]
    return torch.tensor(mask, dtype=torch.bool)


def _glued_splitter(tokenizer: Tokenizer) -> spm.SentencePieceProcessor:
    """The target sentencepiece model without its dummy prefix: it splits ``"Hund"`` as the
    word is split after ``„`` (``Hund``, not ``▁Hund``)."""
    proto = model_proto(tokenizer.tgt.serialized_model_proto())
    proto.normalizer_spec.add_dummy_prefix = False
    proc = spm.SentencePieceProcessor()
    proc.LoadFromSerializedProto(proto.SerializeToString())
    return proc


def word_pieces(
    tokenizer: Tokenizer, constraints: Sequence[Sequence[Sequence[int]]] | None = None
) -> WordPieces:
    """What the constrained search needs of the target pieces (`WordPieces`): the pieces that
    continue a word, the glue pieces (ending in an opening bracket or quote, a straight quote,
    an apostrophe or ``▁``: ``▁„``, ``(``, ``l'``, ``▁``; a word may follow them without its
    ``▁``, but not a full stop or a hyphen), and the glued form of each constraint (its text
    split by `_glued_splitter`; none where that has unknown pieces or equals the
    constraint)."""
    pieces = tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))
    special = {PAD_ID, UNK_ID, BOS_ID, EOS_ID}
    glue = frozenset(
        i
        for i, p in enumerate(pieces)
        if i not in special
        and p
        and (p[-1] in GLUE_CHARS or unicodedata.category(p[-1]) in GLUE_CATEGORIES)
    )
    glued: dict[tuple[int, ...], tuple[int, ...]] = {}
    distinct = {tuple(c) for phrases in constraints or [] for c in phrases}
    if distinct:
        splitter = _glued_splitter(tokenizer)
        ids_of = tokenizer.vocab.ids if tokenizer.vocab is not None else None
        for c in distinct:
            text = tokenizer.decode_tgt([c])[0]
            split = splitter.encode(text, out_type=str)
            ids = tuple(
                ids_of.get(p, UNK_ID) if ids_of is not None else tokenizer.tgt.piece_to_id(p)
                for p in split
            )
            if ids and UNK_ID not in ids and ids != c:
                glued[c] = ids
    return WordPieces(word_continuation(tokenizer), glue, glued)


__all__ = [
    "Ids",
    "byte_fallback",
    "check_constraints",
    "check_known_pieces",
    "check_prefixes",
    "encode_steering",
    "log_raised_beams",
    "word_continuation",
    "word_pieces",
]
