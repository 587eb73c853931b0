"""API keys written as ``***`` in every log line of the process (`redact_keys_in_logs`):
``api_key=...`` values in any text and the literal text of every known key, uvicorn's access
line included. `litmt.deploy.access` installs it when a server's keys are loaded."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# api_key=..., "api_key": "...", 'api_key': '...' (query strings, form bodies, JSON, dicts)
_KEY_FIELD = re.compile(r"""(api_key['"]?\s*[=:]\s*['"]?)([^\s&'",;}\]]+)""", re.IGNORECASE)
_MIN_KEY_CHARS = 4  # shorter known keys are not searched for in log text (only api_key=...)


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
        self.keys: set[str] = set()
        self.known: re.Pattern[str] | None = None
        self.installed = False
        self.lock = threading.Lock()

    def add(self, keys: Any) -> None:
        with self.lock:
            self.keys.update(k for k in keys if len(k) >= _MIN_KEY_CHARS)
            if self.keys:  # the longest first, so a key that contains another goes whole
                ordered = sorted(self.keys, key=len, reverse=True)
                self.known = re.compile("|".join(map(re.escape, ordered)))

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
        if "api_key" in text.lower():
            text = _KEY_FIELD.sub(lambda m: m.group(1) + REDACTED, text)
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
        if isinstance(record.args, Mapping):
            record.args = {k: self.value(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(self.value(a) for a in record.args)
        return record


_REDACTOR = _KeyRedactor()


def redact_keys_in_logs(keys: Any = ()) -> None:
    """From now on, write ``api_key=...`` values and the given `keys` (of 4 characters or
    more) as ``***`` in every log record of this process, uvicorn's access line included."""
    _REDACTOR.add(keys)
    _REDACTOR.install()


__all__ = ["REDACTED", "redact_keys_in_logs"]
