"""The constraint state of a hypothesis in the constrained search (`litmt.decoding.constraints`).

Per constraint, met (`MET`) or the length of its longest prefix that ends the hypothesis (a
KMP automaton per constraint, so a failed partial match falls back to the longest prefix
that still fits, and an overlap is tracked by every constraint it touches). Its *bank* is the
number of constraint tokens it has produced: the lengths of the met constraints plus the
longest partial match among the others (0 .. C, C = all constraint tokens of the sentence;
C exactly when every constraint is met).
"""

from __future__ import annotations

from collections.abc import Sequence

MET = -1  # the state of a met constraint

State = tuple[int, ...]  # per constraint: MET or its matched prefix length


class Tracker:
    """The constraints of one sentence and the automaton that tracks them.

    Args:
        constraints: target id sequences (each non-empty).
    """

    def __init__(self, constraints: Sequence[Sequence[int]]) -> None:
        self.phrases = [tuple(c) for c in constraints]
        self.total = sum(len(c) for c in self.phrases)  # C: the top bank
        self.start: State = tuple(0 for _ in self.phrases)
        self._next: dict[
            tuple[int, int, int], int
        ] = {}  # (constraint, progress, token) -> progress

    def _step(self, c: int, progress: int, token: int) -> int:
        """KMP transition: the longest prefix of constraint `c` ending the hypothesis after
        `token`, given that its `progress` first tokens ended it before."""
        key = (c, progress, token)
        found = self._next.get(key)
        if found is None:
            phrase = self.phrases[c]
            seq = (*phrase[:progress], token)
            found = 0
            for k in range(min(len(seq), len(phrase)), 0, -1):
                if seq[len(seq) - k :] == phrase[:k]:
                    found = k
                    break
            self._next[key] = found
        return found

    def advance(self, state: State, token: int) -> State:
        """The state after appending `token`."""
        out = []
        for c, progress in enumerate(state):
            if progress == MET:
                out.append(MET)
                continue
            k = self._step(c, progress, token)
            out.append(MET if k == len(self.phrases[c]) else k)
        return tuple(out)

    def bank(self, state: State) -> int:
        """Constraint tokens produced: the met constraints' lengths plus the longest partial
        match of the others (the max, not the sum: one token that starts two constraints,
        such as a lone ``▁``, is one token of progress, not two)."""
        met = sum(len(p) for p, s in zip(self.phrases, state, strict=True) if s == MET)
        return met + max((s for s in state if s != MET), default=0)

    def done(self, state: State) -> bool:
        """Every constraint is met."""
        return all(s == MET for s in state)

    def wanted(self, state: State) -> set[int]:
        """Tokens that advance an unmet constraint: its next token, or its first."""
        out = set()
        for p, s in zip(self.phrases, state, strict=True):
            if s != MET:
                out.add(p[s])
                out.add(p[0])
        return out


__all__ = ["MET", "State", "Tracker"]
