"""Stopping a search between two decoder steps.

A caller that may abandon a decode (the server, once every client of a batch has gone or
timed out) runs it under `stop_when(check)`; every search loop (greedy and sampling, beam,
constrained) calls `check_stop(step)` once per step, which raises `DecodeStopped` when
`check()` is true. The check lives in a context variable, so it reaches the loops through
`Translator.translate`, `decode()` and the engines without a parameter on each, and a decode
in another thread or context is never affected. Not for ``sync_steps`` runs: a rank that
stops alone would leave the others waiting in a collective.

An engine whose search runs outside Python (CTranslate2) cannot be stopped between steps; under
`stop_when` it decodes in sub-batches of at most `stop_grain()` sentences and checks between
them, so it stops within one sub-batch (`litmt.deploy.engines.ct2`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_STOP: ContextVar[Callable[[], bool] | None] = ContextVar("litmt_decode_stop", default=None)
_GRAIN: ContextVar[int | None] = ContextVar("litmt_decode_stop_grain", default=None)
DEFAULT_GRAIN = 16  # sentences per sub-batch of an engine that checks between sub-batches


class DecodeStopped(RuntimeError):
    """A search abandoned at a step boundary: no one waits for its result any more."""


@contextmanager
def stop_when(check: Callable[[], bool], grain: int = DEFAULT_GRAIN) -> Iterator[None]:
    """Within the block, every search stops at its next step once `check()` is true; an
    engine that checks between sub-batches instead uses sub-batches of at most `grain`
    sentences.

    Raises:
        ValueError: `grain` < 1.
    """
    if grain < 1:
        raise ValueError(f"the stop grain must be at least 1 sentence, got {grain}")
    token, grain_token = _STOP.set(check), _GRAIN.set(grain)
    try:
        yield
    finally:
        _STOP.reset(token)
        _GRAIN.reset(grain_token)


def stop_grain() -> int | None:
    """Sentences per sub-batch for an engine that checks between sub-batches: None outside
    `stop_when` (nothing can stop the decode, so nothing is split)."""
    return _GRAIN.get() if _STOP.get() is not None else None


def check_stop(step: int) -> None:
    """Called by each search loop once per decoder step.

    Raises:
        DecodeStopped: the enclosing `stop_when` check is true.
    """
    check = _STOP.get()
    if check is not None and check():
        raise DecodeStopped(f"decoding stopped at step {step}: no one waits for its result")


__all__ = ["DEFAULT_GRAIN", "DecodeStopped", "check_stop", "stop_grain", "stop_when"]
