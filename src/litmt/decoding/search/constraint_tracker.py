"""The constraint state of a hypothesis in the constrained search (`litmt.decoding.search.constrained`).

Occurrences count: a phrase listed n times must appear n times (non-overlapping occurrences,
as in Sockeye); different phrases may share tokens ("roter Hund" and "Hund rennt" are both
met by "roter Hund rennt").

Forms: a phrase is met by its ``▁word`` form (its tokenisation inside a sentence) or, where
the word follows a piece that ends in an opening bracket or quote, a straight quote or an
apostrophe (``▁„``, ``(``, ``l'``, a lone ``▁``; the *glue* pieces of `WordPieces`), by its
glued form (the same words tokenised without the leading ``▁``), as the model writes
„Hund“ or (Hund).

Per phrase, the occurrences met so far and, per form, the length of its longest prefix that
ends the hypothesis (a KMP automaton, so a failed partial match falls back to the longest
prefix that still fits). Its *bank* is the number of constraint tokens it has produced: the
lengths of the met occurrences plus the longest partial match among the unmet phrases
(0 .. C, C = the tokens of every listed constraint; C exactly when every one is met).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor

Phrase = tuple[int, ...]


@dataclass(frozen=True)
class WordPieces:
    """What the constrained search knows of the target pieces (`litmt.decoding.steering.
    word_pieces` builds it from the tokenizer).

    Attributes:
        continuation: (V,) bool, the pieces that continue a word (no leading ``▁``, a letter
            or digit first); blocked right after a constraint is completed.
        glue: the pieces after which a word may start without its ``▁``.
        glued: a constraint's ids -> its glued form's ids (absent: it has none).
    """

    continuation: Tensor
    glue: frozenset[int] = frozenset()
    glued: Mapping[Phrase, Phrase] = field(default_factory=dict)


class State(NamedTuple):
    """A hypothesis's constraint state: `glue`, its last token is a glue piece; `phrases`, per
    distinct phrase (occurrences met, then the progress of each of its forms)."""

    glue: bool
    phrases: tuple[tuple[int, ...], ...]


class Tracker:
    """The constraints of one sentence and the automaton that tracks them.

    Args:
        constraints: target id sequences (each non-empty); a repeated one must occur again.
        words: the glue pieces and glued forms; None = only the ``▁word`` forms.
    """

    def __init__(
        self, constraints: Sequence[Sequence[int]], words: WordPieces | None = None
    ) -> None:
        counts = Counter(tuple(c) for c in constraints)
        self.phrases = list(counts)  # distinct, in order of first listing
        self.need = [counts[p] for p in self.phrases]
        self.glue = words.glue if words is not None else frozenset()
        glued = words.glued if words is not None else {}
        # per phrase, its forms: the ▁word form first, then the glued one (if any, different)
        self.forms = [[p, *([glued[p]] if glued.get(p, p) != p else [])] for p in self.phrases]
        self.total = sum(len(p) * n for p, n in zip(self.phrases, self.need, strict=True))
        self.start = State(True, tuple((0,) + (0,) * len(f) for f in self.forms))
        self._next: dict[tuple[int, int, int, int, bool], int] = {}
        self._advanced: dict[tuple[State, int], State] = {}  # memo of `advance`
        self._banks: dict[State, int] = {}  # memo of `bank`

    def _step(self, c: int, f: int, progress: int, token: int, after_glue: bool) -> int:
        """KMP transition of form `f` of phrase `c`: the longest prefix of the form ending the
        hypothesis after `token`, given that its `progress` first tokens ended it before. A
        glued form (f > 0) may only start after a glue piece (`after_glue` for a start at
        `token`)."""
        key = (c, f, progress, token, after_glue)
        found = self._next.get(key)
        if found is None:
            form = self.forms[c][f]
            seq = (*form[:progress], token)
            found = 0
            for k in range(min(len(seq), len(form)), 0, -1):
                start = len(seq) - k
                if seq[start:] != form[:k]:
                    continue
                if f > 0 and start == 0 and progress == 0 and not after_glue:
                    continue
                if f > 0 and start > 0 and seq[start - 1] not in self.glue:
                    continue
                found = k
                break
            self._next[key] = found
        return found

    def advance(self, state: State, token: int) -> State:
        """The state after appending `token` (memoised: many beams share a state)."""
        found = self._advanced.get((state, token))
        if found is None:
            found = self._advanced[(state, token)] = self._advance(state, token)
        return found

    def _advance(self, state: State, token: int) -> State:
        out = []
        for c, (met, *progress) in enumerate(state.phrases):
            if met == self.need[c]:
                out.append((met, *progress))
                continue
            steps = [self._step(c, f, p, token, state.glue) for f, p in enumerate(progress)]
            if any(k == len(form) for k, form in zip(steps, self.forms[c], strict=True)):
                out.append((met + 1, *[0] * len(steps)))  # an occurrence: start afresh
            else:
                out.append((met, *steps))
        return State(token in self.glue, tuple(out))

    def bank(self, state: State) -> int:
        """Constraint tokens produced: the met occurrences' lengths plus the longest partial
        match of the unmet phrases (the max, not the sum: one token that starts two
        constraints, such as a lone ``▁``, is one token of progress, not two)."""
        found = self._banks.get(state)
        if found is None:
            found = self._banks[state] = self._bank(state)
        return found

    def _bank(self, state: State) -> int:
        met = sum(len(p) * s[0] for p, s in zip(self.phrases, state.phrases, strict=True))
        partial = [
            min(max(s[1:]), len(p) - 1)
            for p, s, n in zip(self.phrases, state.phrases, self.need, strict=True)
            if s[0] < n
        ]
        return met + max(partial, default=0)

    def done(self, state: State) -> bool:
        """Every listed occurrence is met."""
        return all(s[0] == n for s, n in zip(state.phrases, self.need, strict=True))

    def completed(self, before: State, after: State) -> bool:
        """`after` met one more occurrence than `before` (its last token ended a constraint)."""
        return any(a[0] > b[0] for a, b in zip(after.phrases, before.phrases, strict=True))

    def wanted(self, state: State) -> set[int]:
        """Tokens that advance an unmet phrase: a form's next token, or its first (a glued
        form's first only after a glue piece)."""
        out = set()
        for c, (met, *progress) in enumerate(state.phrases):
            if met == self.need[c]:
                continue
            for f, (form, p) in enumerate(zip(self.forms[c], progress, strict=True)):
                if p > 0:
                    out.add(form[p])
                if f == 0 or state.glue:
                    out.add(form[0])
        return out


__all__ = ["Phrase", "State", "Tracker", "WordPieces"]
