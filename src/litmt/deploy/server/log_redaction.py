"""API keys written as ``***`` in every log line of the process (`redact_keys_in_logs`):
``api_key=...`` values in any text and the literal text of every known key, uvicorn's access
line included. `litmt.deploy.server.access` installs it when a server's keys are loaded."""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
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
        ordered = sorted(self.keys, key=len, reverse=True)
        self.known = re.compile(
            r"(?<![\w-])(?:" + "|".join(map(re.escape, ordered)) + r")(?![\w-])"
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
        if isinstance(record.args, Mapping):  # log("%s", {...}) and log("%(key)s", {...})
            record.args = {
                k: REDACTED if "api_key" in str(k).lower() else self.value(v)
                for k, v in record.args.items()
            }
        elif record.args:
            record.args = tuple(self.value(a) for a in record.args)
        return record


_REDACTOR = _KeyRedactor()


def redact_keys_in_logs(keys: Any = ()) -> None:
    """From now on, write ``api_key=...`` values and the given `keys` (of 4 characters or
    more, as whole tokens) as ``***`` in every log record of this process, uvicorn's access
    line included."""
    _REDACTOR.add(keys)
    _REDACTOR.install()


def forget_keys_in_logs(keys: Any) -> None:
    """A server that stops: its `keys` are no longer searched for (unless another server of
    this process holds them too); ``api_key=...`` values stay redacted."""
    _REDACTOR.remove(keys)


__all__ = ["REDACTED", "forget_keys_in_logs", "redact_keys_in_logs"]
