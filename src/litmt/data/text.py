"""Reading text lines: one policy for the line ends and bad bytes of user files."""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from litmt.errors import DataError

log = logging.getLogger(__name__)


# -- reading text lines ------------------------------------------------------------------
def strip_line_end(line: str) -> str:
    """`line` without its "\\n" and a "\\r" right before it (CRLF); other characters stay."""
    return line.removesuffix("\n").removesuffix("\r")


def read_lines(stream: IO[bytes], name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream (a file opened "rb", ``sys.stdin.buffer``), lazily.

    The policy (module docstring): a UTF-8 byte-order mark at the very start is dropped;
    only "\\n" ends a line (a lone "\\r", U+2028 or form feed stay inside the line, so line
    numbers match ``wc -l``); "\\r\\n" ends a line too; the last line needs no newline and a
    final newline adds no empty line; empty lines are kept; bytes that are not UTF-8 become
    U+FFFD with a warning naming `name` and the line. A line is yielded as soon as it is
    read (interactive stdin answers line by line).
    """
    for number, raw in enumerate(stream, start=1):
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            log.warning("%s line %d: bytes that are not UTF-8 replaced by U+FFFD", name, number)
        yield strip_line_end(text)


def read_text_file(path: str | Path, what: str) -> list[str]:
    """All lines of a text file under the `read_lines` policy.

    Raises:
        DataError: the file does not exist (the message names `what`, e.g. "src_file").
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} not found: {p}")
    with p.open("rb") as f:
        return list(read_lines(f, what))
