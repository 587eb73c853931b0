"""Shared plumbing for the scripts: user errors become one line on stderr and exit status 2.

A script is its docstring and one call (`run_script` checks the command line, then runs the
target under ``@hydra.main`` with the errors turned into one line)::

    if __name__ == "__main__":
        run_script("evaluate", "litmt.cli.evaluate:evaluate")

or, around any block: ``with cli_errors(): ...``. `log_to_stderr()` prints the ``litmt``
loggers' messages on stderr (``warning: ...``), for scripts whose stdout is data.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

from litmt.cli.script.exits import run_cli

if TYPE_CHECKING:
    from omegaconf import DictConfig


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

    First `expand_short_overrides` (``beam_size=5`` is ``decoding.beam_size=5``) and
    `check_command_line` (an unknown config group option: one line, exit 2), then
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

    from litmt.cli.script.config_check import (
        check_command_line,
        expand_short_overrides,
        script_conf_dir,
    )

    sys.argv[1:] = expand_short_overrides(sys.argv[1:], config_name, script_conf_dir())
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
