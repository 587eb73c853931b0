"""Shared plumbing for the scripts: user errors become one line on stderr and exit status 2.

A script is its docstring and one call (`run_script` checks the command line, then runs the
target under ``@hydra.main`` with the errors turned into one line)::

    if __name__ == "__main__":
        run_script("evaluate", "litmt.evaluate:evaluate")

or, around any block: ``with cli_errors(): ...``. `log_to_stderr()` prints the ``litmt``
loggers' messages on stderr (``warning: ...``), for scripts whose stdout is data.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from litmt.errors import LitmtError

if TYPE_CHECKING:
    from omegaconf import DictConfig

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


def run_script(
    config_name: str, target: str, *, stderr_logs: bool = True, objective: str | None = None
) -> Any:
    """Run ``target(cfg)`` as a script on the Hydra config ``conf/<config_name>.yaml``.

    First `check_command_line` (an unknown config group option: one line, exit 2), then
    ``@hydra.main`` with `run_cli` inside it. The config directory is absolute (``../conf``
    next to the script), so Hydra does not resolve it against this module.

    Args:
        config_name: the primary config, e.g. ``"evaluate"``.
        target: ``"module:function"``, imported after Hydra parsed the command line (a fast
            ``--help``); the function takes the composed `DictConfig`.
        stderr_logs: send the ``litmt`` loggers to stderr (`log_to_stderr`), for scripts whose
            stdout carries data or that have no log file.
        objective: a key of the mapping the target returns; its value is what ``main``
            returns, the number Hydra sweepers optimise (None: return nothing).

    Returns:
        What Hydra's ``main`` returns (None when Hydra runs it from the command line).
    """
    import hydra

    from litmt.config_check import check_command_line, script_conf_dir

    check_command_line()
    module, _, name = target.partition(":")

    @hydra.main(config_path=str(script_conf_dir()), config_name=config_name, version_base="1.3")
    @run_cli
    def main(cfg: DictConfig) -> Any:
        if stderr_logs:
            log_to_stderr()
        result = getattr(importlib.import_module(module), name)(cfg)
        return None if objective is None else result.get(objective)

    return main()
