"""How the scripts end: a user error prints one line (no traceback) and exits 2."""

from __future__ import annotations

import functools
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


def user_error_cause(err: BaseException) -> LitmtError | None:
    """The `LitmtError` that `err` wraps (its ``__cause__`` chain), or None.

    Hydra's ``instantiate`` re-raises any error of a ``_target_`` (the datamodule, the
    LightningModule, the trainer) as an ``InstantiationException`` from it.
    """
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, LitmtError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__
    return None


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a `LitmtError` raised inside (or wrapped, as Hydra's ``instantiate`` wraps the
    errors of a ``_target_``) into ``error: <message>`` on stderr and exit 2.

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
    except Exception as err:  # e.g. Hydra's InstantiationException around a `_target_`'s error
        cause = user_error_cause(err)
        if cause is None:
            raise
        sys.stdout.flush()
        print(format_error(cause), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None


def run_cli(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of `cli_errors` (keeps `__wrapped__`, so Hydra finds the script's conf)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with cli_errors():
            return fn(*args, **kwargs)

    return wrapper
