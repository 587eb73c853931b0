"""Benchmark litmt against its peers (`benchmarks.peers`): Hugging Face Marian and
`torch.nn.Transformer`.

Training (forward + backward + optimiser step) and decoding (greedy and beam search, with a
forced number of generated steps) on identical batches of real Multi30k tokens, at identical
sizes, interleaved, with medians over several repetitions. Also the peak tensor memory of each.

    python -m benchmarks.benchmark                       # both sizes, printed
    python -m benchmarks.benchmark --out docs/notebook/2026-12-01-peers.md   # rewrites that page's section
    python -m benchmarks.benchmark --sizes small --reps 3 --out -   # print only
    python -m benchmarks.benchmark --smoke --out -       # a tiny end-to-end run (the test uses it)

The peers come from the `bench` extra (`pip install -e ".[bench]"`); the library never
imports them. Shapes: B batch, S source length, T target length, C d_model, V vocabulary,
K beam size, N forced decode steps.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from benchmarks.common import (
    REPO,
    Batch,
    decode_sources,
    load_tokenizer,
    timed,
    training_batches,
)
from benchmarks.peers import BUILDERS, SIZES, Size, build_litmt, decode_fn, make_train_step
from litmt.errors import LitmtError


def peak_tensor_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of live torch tensors during `fn()` above the level when it started.

    CPU: read from the profiler's allocator events, like tracemalloc but for tensors
    (activations, gradients, optimiser state and temporaries; not Python or libraries).
    CUDA: `torch.cuda.max_memory_allocated` minus the allocation before the call.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence the profiler's start/stop lines (written by C++ straight to fd 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# -- runner -----------------------------------------------------------------------------
@dataclass
class Result:
    """Throughput of one model in one benchmark: a rate per repetition."""

    rates: list[float]
    memory: int | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """Half the min-max range, relative to the median."""
        return (max(self.rates) - min(self.rates)) / 2 / self.median


def interleave(
    fns: dict[str, Callable[[int], float]], reps: int, warmup: int, log: Callable[[str], None]
) -> dict[str, list[float]]:
    """Call each fn(rep) in turn, A B C A B C ..., after `warmup` rounds; rates per rep.

    The order alternates (A B C, C B A, ...) so no model always runs right after another.
    """
    for w in range(warmup):
        for fn in fns.values():
            fn(w)
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(reps):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            rates[name].append(fns[name](r))
        log("  rep {}: {}".format(r, ", ".join(f"{n} {rates[n][-1]:,.0f}" for n in fns)))
    return rates


def bench_training(
    size: Size,
    vocab: int,
    batches: list[Batch],
    args: argparse.Namespace,
    device: torch.device,
    log: Callable[[str], None],
) -> dict[str, Result]:
    """Target tokens/s of a training step for each model, interleaved over the same batches."""
    names = ["litmt", "marian", "nn.Transformer"]
    steps: dict[str, Callable[[Batch], Tensor]] = {}
    for name in names:
        torch.manual_seed(0)
        model = BUILDERS[name](size, vocab, 0.1).to(device).train()
        steps[name] = make_train_step(name, model)
    notes: dict[str, str] = {}
    batches = [b.to(device) for b in batches]
    if args.compile:
        torch.manual_seed(0)
        model = build_litmt(size, vocab, 0.1).to(device).train()
        name = "litmt (compiled)"
        steps[name] = make_train_step("litmt", model, compile_model=True)
        names.append(name)
        with autocast(device, args):  # compile for every batch shape outside the timed loop
            t = sum(timed(lambda b=b: steps[name](b), device) for b in batches)
        notes[name] = f"compilation + {len(batches)} warm-up steps took {t:.0f} s"
        log(f"  {name}: {notes[name]}")

    def runner(name: str) -> Callable[[int], float]:
        def go(rep: int) -> float:
            b = batches[rep % len(batches)]
            return b.n_tokens / timed(lambda: steps[name](b), device)

        return go

    with autocast(device, args):
        rates = interleave({n: runner(n) for n in names}, args.reps, args.warmup, log)
        results = {n: Result(rates[n], note=notes.get(n, "")) for n in names}
        if args.memory:
            for n in names:
                gc.collect()
                results[n].memory = peak_tensor_memory(lambda n=n: steps[n](batches[0]), device)
    return results


def bench_decoding(
    size: Size,
    vocab: int,
    src: Tensor,
    args: argparse.Namespace,
    device: torch.device,
    log: Callable[[str], None],
) -> dict[str, Result]:
    """Generated tokens/s, greedy and beam, litmt vs Marian `generate`, interleaved."""
    models = {}
    for name in ("litmt", "marian"):
        torch.manual_seed(0)
        models[name] = BUILDERS[name](size, vocab, 0.1).to(device).eval()
        if device.type == "cuda" and args.precision != "fp32":
            models[name] = models[name].to(DTYPES[args.precision])
    src = src.to(device)
    fns: dict[str, Callable[[Tensor], Tensor]] = {}
    for beam in (1, args.beam):
        tag = "greedy" if beam == 1 else f"beam {beam}"
        for name, model in models.items():
            fns[f"{name} | {tag}"] = decode_fn(name, model, beam, args.decode_steps)
    n_tokens = src.size(0) * args.decode_steps

    def runner(key: str) -> Callable[[int], float]:
        def go(rep: int) -> float:
            out: list[Tensor] = []
            t = timed(lambda: out.append(fns[key](src)), device)
            assert out[0].shape == (src.size(0), args.decode_steps), (key, out[0].shape)
            return n_tokens / t

        return go

    rates = interleave({k: runner(k) for k in fns}, args.reps, args.warmup, log)
    results = {k: Result(rates[k]) for k in fns}
    if args.memory:
        for k in fns:
            gc.collect()
            results[k].memory = peak_tensor_memory(lambda k=k: fns[k](src), device)
    return results


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """bf16/fp16 autocast for training on CUDA; fp32 (no autocast) on CPU."""
    if device.type == "cuda" and args.precision != "fp32":
        return torch.autocast("cuda", dtype=DTYPES[args.precision])
    return contextlib.nullcontext()


# -- report -----------------------------------------------------------------------------
def mib(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 2**20:,.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:,.0f} MiB"


def train_table(results: dict[str, Result]) -> list[str]:
    ref = results["litmt"].median
    lines = [
        "| model | target tokens/s (median) | ± | litmt ÷ this | peak tensor memory |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r.median:,.0f} | {100 * r.spread:.0f}% | "
            f"{ref / r.median:.2f}× | {mib(r.memory)} |"
        )
    notes = [f"{n}: {r.note}." for n, r in results.items() if r.note]
    return lines + (["", *notes] if notes else [])


def decode_table(results: dict[str, Result]) -> list[str]:
    lines = [
        "| search | model | generated tokens/s (median) | ± | litmt ÷ this | peak tensor memory |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key, r in results.items():
        name, tag = key.split(" | ")
        ref = results[f"litmt | {tag}"].median
        lines.append(
            f"| {tag} | {name} | {r.median:,.0f} | {100 * r.spread:.0f}% | "
            f"{ref / r.median:.2f}× | {mib(r.memory)} |"
        )
    return lines


def environment(device: torch.device, args: argparse.Namespace) -> str:
    import transformers

    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    )
    precision = args.precision if device.type == "cuda" else "fp32"
    return (
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}; {where}; {precision}"
    )


BEGIN, END = "<!-- benchmark.py:begin -->", "<!-- benchmark.py:end -->"


def write_section(path: Path, text: str) -> None:
    """Put `text` between the BEGIN/END markers of `path` (appended when they are absent)."""
    block = f"{BEGIN}\n{text.rstrip()}\n{END}\n"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        new = before + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")


# -- main -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="small,base", help="comma list of: small, base")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per model")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded target tokens/batch")
    p.add_argument("--decode-batch", type=int, default=32, help="sentences decoded at once")
    p.add_argument("--decode-steps", type=int, default=32, help="forced generated steps")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--vocab", type=int, default=8000, help="joint sentencepiece vocabulary")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="bf16", choices=list(DTYPES), help="on CUDA only")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(litmt)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip memory")
    p.add_argument("--skip", default="", help="comma list of: train, decode")
    p.add_argument("--cache", default=str(REPO / "data" / "benchmark"), help="tokenizer dir")
    p.add_argument(
        "--out",
        default="-",
        help="a markdown file whose benchmark section is replaced (a lab notebook page, "
        "docs/notebook/); - = print only",
    )
    p.add_argument("--smoke", action="store_true", help="tiny model and data: seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.reps, args.warmup, args.max_tokens = "tiny", 2, 1, 256
        args.decode_batch, args.decode_steps, args.beam, args.vocab = 4, 5, 3, 300
    unknown = set(args.sizes.split(",")) - set(SIZES)
    if unknown:
        raise LitmtError(f"unknown size(s) {sorted(unknown)}; valid: {', '.join(SIZES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    device = torch.device(args.device)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    tok = load_tokenizer(args.vocab, 3000 if args.smoke else None, Path(args.cache))
    vocab = tok.src_vocab_size
    batches = training_batches(tok, args.max_tokens, max(args.reps, 1))
    src = decode_sources(tok, args.decode_batch)
    out: list[str] = []
    skip = set(filter(None, args.skip.split(",")))
    for size_name in args.sizes.split(","):
        size = SIZES[size_name]
        if "train" not in skip:
            toks = [b.n_tokens for b in batches]
            log(f"training, {size.label()}; target tokens/batch {toks}")
            res = bench_training(size, vocab, batches, args, device, log)
            out += [
                f"#### Training, {size.label()}, FFN {size.d_ff}, vocab {vocab}",
                "",
                f"Median of {args.reps} interleaved repetitions after {args.warmup} warm-up "
                f"round(s); {len(batches)} length-sorted batches of {min(toks)}–{max(toks)} "
                f"non-padding target tokens (≤ {args.max_tokens} padded), the same for all.",
                "",
                *train_table(res),
                "",
            ]
        if "decode" not in skip:
            log(f"decoding, {size.label()}")
            res = bench_decoding(size, vocab, src, args, device, log)
            out += [
                f"#### Decoding, {size.label()}",
                "",
                f"{src.size(0)} test2016 sentences at once, exactly {args.decode_steps} "
                f"generated tokens each (eos suppressed); median of {args.reps} interleaved "
                "repetitions.",
                "",
                *decode_table(res),
                "",
            ]
    minutes = (time.perf_counter() - t_start) / 60
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    header = [
        f"Command: `{f'python -m benchmarks.benchmark {argv_text}'.strip()}`",
        "",
        f"Environment: {environment(device, args)}; joint sentencepiece vocabulary {vocab}; "
        f"took {minutes:.1f} min; 1-min load average {load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end.",
        "",
    ]
    text = "\n".join(header + out)
    print(text)
    if args.out != "-":
        write_section(Path(args.out), text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LitmtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
