"""The rows of `scripts/gpu_check.py` about the machine and its attention kernels: environment,
kernel packages, the corpus, loss parity and flex against sdpa speed.

Each function measures one row and returns (result, status); `Rows.measure` guards it.
"""

from __future__ import annotations

import importlib.metadata
import math
import time

import torch
from gpu_check_common import (
    DISTRIBUTIONS,
    LOSS_TOLERANCE,
    Corpus,
    State,
    final_loss,
    train_run,
    unavailable,
)

from litmt.attention.backends.flex_compile import compile_fallback

Row = tuple[str, str]  # (result, status)


# -- 1. environment --------------------------------------------------------------------------
def environment(st: State) -> Row:
    if st.args.accelerator == "gpu":
        cap = "sm{}{}".format(*torch.cuda.get_device_capability())
        where = f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()} {cap}"
    else:
        where = "CPU (dry run)"
    return f"torch {torch.__version__}, {where}", "ok"


def kernel_package(backend: str, pkg: str) -> Row:
    """The version of `pkg`, or why `backend` cannot use it (its rows are then skipped)."""
    problem = unavailable(backend)
    if problem is not None:
        status, why = problem
        result = why if status == "not installed" else f"not usable: {why}"
        return f"{result}; its rows are not run", status
    try:
        version = importlib.metadata.version(DISTRIBUTIONS.get(pkg, pkg))
    except importlib.metadata.PackageNotFoundError:
        version = "installed (no distribution metadata)"
    return version, "ok"


def corpus(st: State) -> Row:
    """Read Multi30k (or the toy pairs), train or load the tokenizer, tokenise the pairs."""
    t0 = time.perf_counter()
    st.corpus = Corpus(st.args.data, st.args.out, st.args.vocab_size)
    tok = st.corpus.tokenizer
    result = (
        f"{len(st.corpus.pairs)} train pairs, {len(st.corpus.test_src)} test sentences, "
        f"vocab {tok.src_vocab_size}/{tok.tgt_vocab_size} ({time.perf_counter() - t0:.0f}s)"
    )
    return result, "ok"


# -- 2. parity -------------------------------------------------------------------------------
def skipped(backend: str) -> Row | None:
    """The row of a backend that cannot run here ("not installed" / "not usable: ..."), or None."""
    problem = unavailable(backend)
    if problem is None:
        return None
    status, why = problem
    return (
        (why, "not installed") if status == "not installed" else (f"not usable: {why}", "skipped")
    )


def fell_back() -> Row | None:
    """A FAIL row if compiled flex fell back to eager flex in this process, else None."""
    why = compile_fallback()
    return None if why is None else (f"compiled flex fell back to eager: {why}", "FAIL")


def parity(st: State, backend: str, precision: str) -> Row:
    """`--steps` steps of `backend` in `precision` from seed 0; its final loss against sdpa's.

    sdpa runs first in each precision and is the reference. A flex run may take
    `--run-cap-s` plus what is left of the compile allowance (`--flex-compile-s`); its time
    beyond its steps at their median pace is taken from the allowance.
    """
    args = st.args
    if (row := skipped(backend)) is not None:
        return row
    if st.deadline.left() < args.margin_s + 5:
        return "not run: the deadline was reached", "FAIL"
    flex = backend == "flex"
    cap = args.run_cap_s + (st.flex_compile_left if flex else 0.0)
    t0 = time.perf_counter()
    log = train_run(st.need_corpus(), args.size, backend, precision, args=args,
                    deadline=st.deadline, steps=args.steps, cap_s=cap)  # fmt: skip
    secs, loss, done = time.perf_counter() - t0, final_loss(log.losses), len(log.losses)
    overhead = log.overhead_s(t0)
    if flex:
        st.flex_compile_left = max(0.0, st.flex_compile_left - overhead)
    if precision == "bf16-mixed":
        st.bf16[backend] = log
    if flex and (row := fell_back()) is not None:
        return row
    if done < args.steps or not math.isfinite(loss):
        stop = "its cap of --run-cap-s" + (" + the compile allowance" if flex else "")
        result = f"{done}/{args.steps} steps in {secs:.0f}s (cap {cap:.0f}s)"
        return f"{result} (stopped by {stop}, or the deadline), last loss {loss:.4f}", "FAIL"
    took = f"{secs:.0f}s" + (f", start-up and compile {overhead:.0f}s" if flex else "")
    if backend == "sdpa":
        st.ref[precision] = loss
        return f"final loss {loss:.4f} ({took})", "ref"
    ref = st.ref.get(precision)
    if ref is None:
        return f"final loss {loss:.4f}; no sdpa reference", "FAIL"
    rel = abs(loss - ref) / ref
    result = (
        f"final loss {loss:.4f} vs sdpa {ref:.4f}: {100 * rel:.2f} % "
        f"(tolerance {100 * LOSS_TOLERANCE:.0f} %, {took})"
    )
    return result, "ok" if rel <= LOSS_TOLERANCE else "FAIL"


# -- 4. flex against sdpa --------------------------------------------------------------------
def flex_speed(st: State) -> Row:
    """Steady-state target tokens/s of the bf16 flex and sdpa parity runs (no extra run)."""
    args = st.args
    if "flex" not in args.backends:
        return "not in the dry run (flex compiles for minutes on a CPU)", "skipped"
    problem = unavailable("flex")
    if problem is not None:
        return problem[1], "FAIL"
    if (row := fell_back()) is not None:
        return row
    if "flex" not in st.bf16 or "sdpa" not in st.bf16:
        return "no flex or sdpa bf16 run", "FAIL"
    flex, sdpa = (st.bf16[k].tokens_per_s(args.speed_skip) for k in ("flex", "sdpa"))
    ok = math.isfinite(flex) and math.isfinite(sdpa)
    result = f"flex {flex:,.0f} vs sdpa {sdpa:,.0f} target tok/s ({flex / sdpa:.2f}x)"
    return result, "ok" if ok else "FAIL"
