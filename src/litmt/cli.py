"""Shared plumbing for the scripts: user errors become one line on stderr and exit status 2.

Usage in a script (put `run_cli` *under* `@hydra.main`, so it runs inside the Hydra job)::

    @hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
    @run_cli
    def main(cfg: DictConfig) -> None:
        evaluate(cfg)

or, around any block: ``with cli_errors(): ...``. `log_to_stderr()` prints the ``litmt``
loggers' messages on stderr (``warning: ...``), for scripts whose stdout is data.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from litmt.errors import LitmtError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_USER_ERROR = 2


def format_error(err: BaseException) -> str:
    """``error: <first line of the message>``."""
    text = str(err).strip().splitlines()
    return f"error: {text[0] if text else type(err).__name__}"


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a `LitmtError` raised inside into ``error: <message>`` on stderr and exit 2.

    Other exceptions are bugs and keep their traceback. Ctrl-C exits 130 without one; a
    closed stdout pipe exits 1 silently.
    """
    try:
        yield
    except LitmtError as err:
        sys.stdout.flush()
        print(format_error(err), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except BrokenPipeError:  # e.g. `translate.py | head -1`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        raise SystemExit(1) from None


def run_cli(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of `cli_errors` (keeps `__wrapped__`, so Hydra finds the script's conf)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with cli_errors():
            return fn(*args, **kwargs)

    return wrapper


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        return msg if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {msg}"


def log_to_stderr(level: int = logging.INFO) -> None:
    """Send the ``litmt`` loggers to stderr only: ``warning: <message>`` (info: the message).

    Idempotent. Messages then no longer propagate to the root logger (use it in scripts
    whose stdout carries data, such as translate.py).
    """
    logger = logging.getLogger("litmt")
    logger.setLevel(level)
    logger.propagate = False
    if not any(getattr(h, "litmt_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Formatter())
        handler.litmt_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
