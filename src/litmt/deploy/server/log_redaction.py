"""API keys written as ``***`` in every log line of the process (`redact_keys_in_logs`):
the value of every ``api_key`` field in any text and the text of every known key, uvicorn's
access line and tracebacks included. `litmt.deploy.server.access` installs it when a
server's keys are loaded.

A field is found by its name in any encoding (``api_key``, ``api%5Fkey``, ``"api_key"``,
``api\\u005fkey``, any case) followed by ``=``, ``:`` or ``%3D``; its value is then read as
its syntax says: a quoted string (JSON or Python, escapes included) to its closing quote, an
unquoted one (a query string or form) to the next ``&`` or blank, so a key holding
``; , ' " } ]`` goes whole. A known key is also found as it appears JSON-, Python- or
percent-encoded.

`throttle_repeats` (installed with the redaction on uvicorn's error log and litmt's server
logs) writes a line repeated within `REPEAT_WINDOW_S` once, with a count of the others on
its next appearance: a client cannot flood the log with one warning.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
_MIN_KEY_CHARS = 4  # shorter known keys are not searched for in log text (only api_key=...)


def _any_encoding(char: str) -> str:
    """A regex of `char` written plainly, percent-encoded (once or twice) or escaped."""
    code = ord(char)
    forms = [
        re.escape(char),
        f"%{code:02x}",
        f"%25{code:02x}",
        rf"\\+u{code:04x}",
        rf"\\+x{code:02x}",
    ]
    return "(?:" + "|".join(forms) + ")"


# the field's name in any encoding, its closing quote (if any) and the separator
_KEY_NAME = re.compile(
    "".join(_any_encoding(c) for c in "api_key") + r"""(?:\\*['"]|%22|%27)?\s*(?:=|:|%3d)\s*""",
    re.IGNORECASE,
)
_QUOTE = re.compile(r"""(\\*)(['"])""")  # a quoted value's opening: \" in JSON inside a string
_VALUE_END = re.compile(r"[&\s]")  # an unquoted value (query string, form) ends here
_AFTER_CLOSE = set(" \t\r\n,}])&;\\")  # what may follow a quoted value's closing quote


def _quoted_end(text: str, start: int, escapes: str, quote: str) -> int:
    """Where the quoted value that starts at `start` (after its opening quote) ends: its
    closing `escapes` + `quote`, unescaped and followed by the end or a delimiter (a quote
    inside a key that was not escaped, as a bad client writes it, does not end it)."""
    close = escapes + quote
    i = start
    while i < len(text):
        if text.startswith(close, i) and (not escapes or text[i - 1 : i] != "\\"):
            after = i + len(close)
            if after >= len(text) or text[after] in _AFTER_CLOSE:
                return i
            i = after
            continue
        if not escapes and text[i] == "\\":
            i += 2  # an escaped character
            continue
        i += 1
    return len(text)


def redact_fields(text: str) -> str:
    """`text` with the value of every ``api_key`` field written as ``***``."""
    out, pos = [], 0
    while (name := _KEY_NAME.search(text, pos)) is not None:
        start = name.end()
        opening = _QUOTE.match(text, start)
        if opening is not None:
            start = opening.end()
            end = _quoted_end(text, start, opening.group(1), opening.group(2))
        else:
            found = _VALUE_END.search(text, start)
            end = found.start() if found else len(text)
        out += [text[pos:start], REDACTED if end > start else ""]
        pos = max(end, start)
        if pos == name.start():  # never loop in place
            pos += 1
    return "".join(out) + text[pos:]


def _written_forms(key: str) -> set[str]:
    """`key` as it may appear in log text: plain, JSON- and Python-escaped, percent-encoded."""
    forms = {key, json.dumps(key)[1:-1], repr(key)[1:-1], repr(key.replace("'", '"'))[1:-1]}
    forms |= {urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key, safe="")}
    forms |= {f.lower() for f in forms if "%" in f}
    return {f for f in forms if len(f) >= _MIN_KEY_CHARS}


class _Redacted:
    """A log argument shown redacted by both %s and %r."""

    def __init__(self, text: str, representation: str) -> None:
        self.text, self.representation = text, representation

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.representation


class _KeyRedactor:
    """Writes API keys as ``***`` in every log record made after `install` (a log record
    factory, so uvicorn's access line and records of every logger and handler are covered)."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()  # key -> servers of this process that hold it
        self.known: re.Pattern[str] | None = None
        self.installed = False
        self.lock = threading.Lock()

    def add(self, keys: Any) -> None:
        with self.lock:
            self.keys.update({k for k in keys if len(k) >= _MIN_KEY_CHARS})
            self._compile()

    def remove(self, keys: Any) -> None:
        with self.lock:
            self.keys.subtract({k for k in keys if len(k) >= _MIN_KEY_CHARS})
            self.keys = +self.keys  # drop the keys no server holds any more
            self._compile()

    def _compile(self) -> None:
        """One pattern of every key as a whole token (a key inside a longer word is another
        word), the longest first, so a key that contains another goes whole."""
        if not self.keys:
            self.known = None
            return
        forms = {form for key in self.keys for form in _written_forms(key)}
        ordered = sorted(forms, key=len, reverse=True)
        self.known = re.compile(
            r"(?<![\w-])(?:" + "|".join(map(re.escape, ordered)) + r")(?![\w-])", re.IGNORECASE
        )

    def install(self) -> None:
        with self.lock:
            if self.installed:
                return
            make = logging.getLogRecordFactory()

            def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
                return self.record(make(*args, **kwargs))

            logging.setLogRecordFactory(factory)
            self.installed = True

    def text(self, text: str) -> str:
        text = redact_fields(text)
        known = self.known
        return known.sub(REDACTED, text) if known is not None else text

    def value(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str):
            return self.text(value)
        shown = str(value)
        redacted = self.text(shown)
        return value if redacted == shown else _Redacted(redacted, self.text(repr(value)))

    def record(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg = self.value(record.msg)
        if isinstance(record.args, Mapping):  # log("%s", {...}) and log("%(key)s", {...})
            record.args = {
                k: REDACTED if "api_key" in str(k).lower() else self.value(v)
                for k, v in record.args.items()
            }
        elif record.args:
            record.args = tuple(self.value(a) for a in record.args)
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            # the traceback as every formatter writes it (Formatter.format keeps exc_text)
            record.exc_text = self.text(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = self.text(record.stack_info)
        return record


_REDACTOR = _KeyRedactor()

REPEAT_WINDOW_S = 10.0  # a line repeated within this many seconds is written once
# `install_throttle`: uvicorn's error log and litmt's per-request warnings (a 500's line,
# which carries its error id, is never left out)
THROTTLED_LOGGERS = (
    "uvicorn.error",
    "litmt.deploy.server.input.request_params",
    "litmt.deploy.server.input.sentences",
)


class RepeatThrottle(logging.Filter):
    """A logging filter that writes each repeated line (same logger, level and message
    template) at most once per `window` seconds; the next one written says how many were
    left out. A client that triggers one warning per request (uvicorn's "Unsupported upgrade
    request." on ``Connection: upgrade``) then cannot flood the log."""

    def __init__(self, window: float = REPEAT_WINDOW_S, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.window, self.clock = window, clock
        self.seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        with self.lock:
            now = self.clock()
            last, left_out = self.seen.get(key, (float("-inf"), 0))
            if now - last < self.window:
                self.seen[key] = (last, left_out + 1)
                return False
            if len(self.seen) > 1000:  # a bounded table: forget the lines of the past
                self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.window}
            self.seen[key] = (now, 0)
        if left_out:
            record.msg = f"{record.msg} ({left_out} more such lines left out)"
        return True


_THROTTLE = RepeatThrottle()


def install_throttle() -> None:
    """`RepeatThrottle` on uvicorn's error log and litmt's server log (`THROTTLED_LOGGERS`),
    once per process."""
    for name in THROTTLED_LOGGERS:
        logger = logging.getLogger(name)
        if _THROTTLE not in logger.filters:
            logger.addFilter(_THROTTLE)


def redact_keys_in_logs(keys: Any = ()) -> None:
    """From now on, write ``api_key=...`` values and the given `keys` (of 4 characters or
    more, as whole tokens) as ``***`` in every log record of this process, uvicorn's access
    line included."""
    _REDACTOR.add(keys)
    _REDACTOR.install()
    install_throttle()


def forget_keys_in_logs(keys: Any) -> None:
    """A server that stops: its `keys` are no longer searched for (unless another server of
    this process holds them too); ``api_key=...`` values stay redacted."""
    _REDACTOR.remove(keys)


__all__ = [
    "REDACTED",
    "RepeatThrottle",
    "forget_keys_in_logs",
    "install_throttle",
    "redact_fields",
    "redact_keys_in_logs",
]
