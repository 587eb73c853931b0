"""What the docs checks (doc_numbers, doc_links, doc_commands) share: the Markdown outside code
blocks, a problem at a place in a file, and the command-line verdict over a list of them."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

FENCE = re.compile(r"^(```|~~~)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the Markdown outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


@dataclass(frozen=True)
class Problem:
    """One thing a check refuses, at ``file:line``."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def report(problems: Sequence[object], what: str = "problem(s)") -> int:
    """Print each problem on stdout and their count on stderr; the exit status (1 if any)."""
    for problem in problems:
        print(problem)
    print(f"{len(problems)} {what}", file=sys.stderr)
    return 1 if problems else 0
