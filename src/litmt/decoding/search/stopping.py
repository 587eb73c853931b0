"""Stopping a search between two decoder steps.

A caller that may abandon a decode (the server, once every client of a batch has gone or
timed out) runs it under `stop_when(check)`; every search loop (greedy and sampling, beam,
constrained) calls `check_stop(step)` once per step, which raises `DecodeStopped` when
`check()` is true. The check lives in a context variable, so it reaches the loops through
`Translator.translate`, `decode()` and the engines without a parameter on each, and a decode
in another thread or context is never affected. Not for ``sync_steps`` runs: a rank that
stops alone would leave the others waiting in a collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("litmt_decode_stop", default=None)


class DecodeStopped(RuntimeError):
    """A search abandoned at a step boundary: no one waits for its result any more."""


@contextmanager
def stop_when(check: Callable[[], bool]) -> Iterator[None]:
    """Within the block, every search stops at its next step once `check()` is true."""
    token = _STOP.set(check)
    try:
        yield
    finally:
        _STOP.reset(token)


def check_stop(step: int) -> None:
    """Called by each search loop once per decoder step.

    Raises:
        DecodeStopped: the enclosing `stop_when` check is true.
    """
    check = _STOP.get()
    if check is not None and check():
        raise DecodeStopped(f"decoding stopped at step {step}: no one waits for its result")


__all__ = ["DecodeStopped", "check_stop", "stop_when"]
