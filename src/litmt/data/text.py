"""Plain text in and out: the one line-reading policy, the one cleaning of user input, the one
output writer.

Reading lines (`read_lines`, `read_text_file`; translate's ``input=FILE`` and stdin, evaluate's
and score's files, the corpora of `litmt.data.corpora.parallel`): UTF-8; a byte-order mark at the very
start is dropped; only "\\n" ends a line (a lone "\\r", U+2028 or form feed stay inside the
line, so line numbers match ``wc -l`` and the two sides of a corpus stay aligned), and a "\\r"
right before it (CRLF) goes with it; the last line needs no newline and a final newline adds
no empty line; empty lines are kept. Bytes that are not UTF-8 depend on the mode:

- ``strict=False`` (user input): they become U+FFFD with a warning naming the file and line;
  one bad byte must not stop a translation;
- ``strict=True`` (corpora): a `DataError` naming the file, line and byte, with the fix; a
  training corpus with bad bytes is a broken file.
"""

from __future__ import annotations

import codecs
import io
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from litmt.errors import DataError

log = logging.getLogger(__name__)

# Every Unicode control character (category Cc: U+0000-001F, U+007F-009F) except tab.
_CONTROL = {c: None for c in [*range(0x20), *range(0x7F, 0xA0)] if c != 0x09}


# -- reading text lines ------------------------------------------------------------------
def strip_line_end(line: str) -> str:
    """`line` without its "\\n" and a "\\r" right before it (CRLF); other characters stay."""
    return line.removesuffix("\n").removesuffix("\r")


def read_lines(stream: IO[bytes], name: str, *, strict: bool = False) -> Iterator[str]:
    """The lines of a UTF-8 byte stream (a file opened "rb", ``sys.stdin.buffer``), lazily.

    The policy and the two modes are the module docstring's. A line is yielded as soon as it
    is read (interactive stdin answers line by line).

    Raises:
        DataError: with `strict`, bytes that are not UTF-8 (naming `name`, the line and the
        byte offset in the stream).
    """
    offset = 0
    for number, raw in enumerate(stream, start=1):
        start = offset
        offset += len(raw)
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw, start = raw[len(codecs.BOM_UTF8) :], start + len(codecs.BOM_UTF8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise DataError(
                    f"{name}: invalid UTF-8 at line {number} (byte {start + exc.start}); "
                    "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`"
                ) from None
            text = raw.decode("utf-8", errors="replace")
            log.warning("%s line %d: bytes that are not UTF-8 replaced by U+FFFD", name, number)
        yield strip_line_end(text)


def read_text_file(path: str | Path, what: str, *, strict: bool = False) -> list[str]:
    """All lines of a text file under the `read_lines` policy.

    Args:
        path: the file.
        what: what it is, for messages (e.g. "src_file").
        strict: refuse bytes that are not UTF-8 (corpora) instead of replacing them.

    Raises:
        DataError: the file does not exist or cannot be read (the message names `what`), or
        (`strict`) is not UTF-8.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} not found: {p}")
    try:
        with p.open("rb") as f:
            return list(read_lines(f, str(p) if strict else what, strict=strict))
    except OSError as exc:
        raise DataError(f"cannot read {what} {p}: {exc.strerror}") from None


# -- cleaning user input -----------------------------------------------------------------
def clean_line(text: str, where: str = "input") -> str:
    """One line of user input as the model sees it: control characters other than tab
    removed, with a warning naming `where` (e.g. "line 3"). Every engine's `prepare` and the
    server's attention view use it.
    """
    cleaned, removed = strip_control(text)
    if removed:
        log.warning("%s: removed %d control character(s)", where, removed)
    return cleaned


def strip_control(text: str) -> tuple[str, int]:
    """`text` without control characters other than tab, and how many were removed (no
    warning: a caller that cleans many lines logs one count, as the server does per request)."""
    cleaned = text.translate(_CONTROL)
    return cleaned, len(text) - len(cleaned)


# -- writing lines -----------------------------------------------------------------------
@contextmanager
def open_output(path: str | Path | None) -> Iterator[IO[str]]:
    """Where a command writes its lines: `path` (parent directories made), or stdout.

    UTF-8 with "\\n" line ends either way. Stdout is wrapped, flushed on exit and left usable
    afterwards (``sys.stdout`` is not closed).
    """
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with Path(path).open("w", encoding="utf-8", newline="\n") as f:
            yield f
        return
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        yield out
    finally:
        out.flush()
        out.detach()


__all__ = [
    "clean_line",
    "open_output",
    "read_lines",
    "read_text_file",
    "strip_control",
    "strip_line_end",
]
