"""The compiled kernel behind `flex`: one per process, a bounded number of compiles, and a
fallback that callers can see.

Shapes: B batch, H heads, T length, D head dim; Bp/Tp the bucketed B/T.

`STATE` is process-wide: ``fn`` the ``torch.compile``d ``flex_attention``, ``buckets`` the
(Bp, H, Tp, D, dtype, device, autograd, mask settings) shapes compiled so far (at most
`MAX_COMPILES`; `over_cap` says when a new one would pass it), ``capped`` whether that was
logged, and ``why``: None while compiling works, else why ``torch.compile`` could not build
the kernel here. From then on every `flex` kernel of the process runs eager flex (exact, but
it materialises the scores): one warning is logged, and `compile_fallback` returns the
reason, so a check that must not accept eager flex (scripts/gpu_check.py) can fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch import Tensor

log = logging.getLogger(__name__)

MAX_COMPILES = 64  # compiled (Bp, Tp, ...) buckets per process; beyond: the dense path
STATE: dict[str, Any] = {"fn": None, "why": None, "buckets": set(), "capped": False}
# dynamo's per-function recompile limit; torch < 2.6 called it cache_size_limit
_LIMIT_NAME = (
    "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
)


def compile_fallback() -> str | None:
    """Why compiled flex fell back to eager flex in this process ("TritonMissing: ..."), or
    None while the compiled kernel runs (or was never asked for)."""
    return STATE["why"]


def cannot_compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which torch.compile says it cannot build a kernel on this machine.

    torch/_inductor/exc.py: ``InductorError`` wraps any failure inside inductor (e.g. a
    ``CppCompileError``), ``InvalidCxxCompiler``, ``TritonMissing``, ``GPUTooOldForTriton``;
    torch/_dynamo/exc.py: ``BackendCompilerFailed`` (older releases wrap them all in it).
    """
    import torch._dynamo.exc as dynamo_exc
    import torch._inductor.exc as inductor_exc

    names = (
        "InductorError",
        "CppCompileError",
        "CUDACompileError",
        "InvalidCxxCompiler",
        "TritonMissing",
        "GPUTooOldForTriton",
    )
    found = [getattr(inductor_exc, n) for n in names if hasattr(inductor_exc, n)]
    return (dynamo_exc.BackendCompilerFailed, *found)


def caused_by_oom(exc: BaseException) -> bool:
    """True if out-of-memory is anywhere in `exc`'s chain (it must propagate)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, torch.OutOfMemoryError):
            return True
        seen.add(id(cur))
        cur = getattr(cur, "inner_exception", None) or cur.__cause__ or cur.__context__
    return False


def _fall_back(exc: BaseException) -> None:
    """Record and log (once) that torch.compile cannot build the kernel: eager flex from now."""
    lines = str(exc).strip().splitlines()
    STATE["why"] = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    log.warning(
        "flex: torch.compile cannot build the kernel here (%s); using eager flex from now on",
        STATE["why"],
    )


def over_cap(bucket: tuple[Any, ...]) -> bool:
    """True if `bucket` is new and `MAX_COMPILES` are compiled already (logged once)."""
    if bucket in STATE["buckets"] or len(STATE["buckets"]) < MAX_COMPILES:
        return False
    if not STATE["capped"]:
        STATE["capped"] = True
        log.warning(
            "flex: %d compiled shapes in this process; further shapes run the dense sdpa path",
            MAX_COMPILES,
        )
    return True


def run_compiled(
    flex_attention: Callable[..., Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_mask: Any,
    bucket: tuple[Any, ...],
) -> Tensor | None:
    """The compiled `flex_attention` on q, k, v (Bp, H, Tp, D): (Bp, H, Tp, D), or None when
    torch.compile cannot build it here (then `compile_fallback` says why).

    Out-of-memory and any error that is not a "cannot compile" one propagate.
    """
    if STATE["fn"] is None:
        try:
            STATE["fn"] = torch.compile(flex_attention, dynamic=False)
        except RuntimeError as exc:  # torch.compile refuses this platform (e.g. the Python)
            _fall_back(exc)
            return None
    # Dynamo's own recompile limit (8 per function) must not turn bucket 9 into eager
    # flex: the buckets are the bound.
    try:
        with torch._dynamo.config.patch(**{_LIMIT_NAME: MAX_COMPILES}):
            out = STATE["fn"](q, k, v, block_mask=block_mask)  # (Bp, H, Tp, D)
    except cannot_compile_errors() as exc:
        if caused_by_oom(exc):
            raise
        _fall_back(exc)
        return None
    STATE["buckets"].add(bucket)
    return out
