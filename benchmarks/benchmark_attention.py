"""Benchmark every attention backend available on this device over sequence length.

For each backend, causal and not, and L = 128 ... 32768 (doubling), it measures the forward
time, the forward+backward time and the peak memory of the kernel alone on random
q, k, v of shape (B, L, H, D) (default B=1, H=8, D=64, fp32 on CPU / bf16 on CUDA).

Each (backend, causal) sweep runs in its own subprocess, L growing. Memory:

- CPU: peak resident set size above the RSS before the call. glibc is told to hand every
  freed block of 64 KB or more back to the OS (MALLOC_MMAP_THRESHOLD_), so RSS falls back
  between calls; the peak is the process high-water mark (getrusage ru_maxrss) when the call
  raised it, which it does as L grows, else the highest RSS sampled every 5 ms.
- CUDA: ``torch.cuda.max_memory_allocated`` above the allocation before the call.

Times are medians of a few calls after a warm-up call (a single timed call once a call
takes longer than --single-run seconds); memory is taken on a separate call, so the RSS
sampler never slows the timed ones. A backend stops growing L once a measurement, or the
prediction from the last two lengths, exceeds --max-seconds or --max-memory-gb, once it runs
out of memory, or when its sweep exceeds --sweep-timeout; the remaining cells show "—".

    python -m benchmarks.benchmark_attention                         # CPU sweep, writes docs/
    python -m benchmarks.benchmark_attention --lengths 128 1024 --backends sdpa linear --out -
    python -m benchmarks.benchmark_attention --device cuda --lengths 1024 4096 16384 --out /tmp/g

Output: markdown tables (stdout and <out>/attention_benchmark.md), a PNG plot
(<out>/attention_benchmark.png) and the raw numbers (<out>/attention_benchmark.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The repository root (not benchmarks.common's REPO: the workers keep their imports to torch,
# so their peak memory is the kernel's).
REPO = Path(__file__).resolve().parents[1]
DEFAULT_LENGTHS = [128 * 2**i for i in range(9)]  # 128 ... 32768
# Backends benchmarked and the options they run with (auto is an alias, reported apart).
BACKENDS: dict[str, dict[str, Any]] = {
    "math": {},
    "sdpa": {},
    "flash": {},
    "xformers": {},
    "te": {},
    "flex": {},
    "local": {"window": 256},
    "sparse": {"mode": "fixed", "block_size": 64, "stride": 4},
    "linear": {},
}
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


# -- worker: one (backend, causal) sweep in its own process ------------------------------
class PeakRSS:
    """Samples this process's RSS in a thread; `peak` is the largest value seen (bytes)."""

    def __init__(self, interval: float = 0.005) -> None:
        import psutil

        self._proc, self._interval = psutil.Process(), interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def __enter__(self) -> PeakRSS:
        self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _maxrss() -> int:
    """This process's RSS high-water mark in bytes (ru_maxrss is in KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _measure(fn: Any, device: str, single_run: float, warm: bool) -> tuple[float, float]:
    """(median seconds, peak bytes above the start) of fn(); a warm-up call first if `warm`."""
    import torch

    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def memory() -> float:  # one call, its peak memory above the start
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        import psutil

        base, high_before = psutil.Process().memory_info().rss, _maxrss()
        with PeakRSS() as rss:
            fn()
        high_after = _maxrss()
        peak = high_after if high_after > high_before else rss.peak
        return peak - base

    if not warm:  # a long call: time it once and take its memory on the same call
        if device == "cuda":
            return timed(), memory()
        t0 = time.perf_counter()
        peak = memory()
        return time.perf_counter() - t0, peak
    first = timed()
    reps = 1 if first > single_run else max(1, min(5, int(1.0 / max(first, 1e-3))))
    seconds = statistics.median(timed() for _ in range(reps))
    return seconds, memory()


def worker(spec: dict[str, Any]) -> None:
    """Sweep L for one (backend, causal); print one JSON line per length."""
    import warnings

    import torch

    from litmt.attention import build_backend

    warnings.filterwarnings("ignore")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device, dtype = spec["device"], getattr(torch, spec["dtype"])
    b, h, d, causal = spec["batch"], spec["heads"], spec["dim"], spec["causal"]
    kernel = build_backend(spec["backend"], **spec["options"])
    done: list[int] = []
    times: list[float] = []
    mems: list[float] = []
    stop: str | None = None
    for n in spec["lengths"]:
        if stop is None and done:
            step = math.log2(n / done[-1])
            t_pred = times[-1] * _growth(times, done, 2.0) ** step
            m_pred = mems[-1] * _growth(mems, done, 1.0) ** step
            if t_pred > spec["max_seconds"]:
                stop = f"time: predicted {t_pred:.0f}s > {spec['max_seconds']:.0f}s"
            elif m_pred > spec["max_memory_gb"] * 1024:
                stop = f"memory: predicted {m_pred / 1024:.1f} GB > {spec['max_memory_gb']:g} GB"
        if stop is not None:
            print(json.dumps({"length": n, "skipped": stop}), flush=True)
            continue
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, n, h, d, device=device, dtype=dtype) for _ in range(3))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

        def forward(q=q, k=k, v=v) -> None:
            with torch.no_grad():
                kernel(q, k, v, causal=causal)

        def forward_backward(leaves=leaves) -> None:
            out = kernel(*leaves, causal=causal)
            out.float().square().mean().backward()
            for t in leaves:
                t.grad = None

        # Warm-up calls compile (flex) and size thread pools; long calls skip them.
        warm = spec["backend"] == "flex" or n <= spec["warm_below"]
        try:
            fwd_s, fwd_peak = _measure(forward, device, spec["single_run"], warm)
            fb_s, fb_peak = _measure(forward_backward, device, spec["single_run"], warm)
        except (RuntimeError, MemoryError) as err:  # CPU and CUDA out-of-memory
            if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
                raise
            stop = "out of memory"
            print(json.dumps({"length": n, "skipped": stop}), flush=True)
            continue
        finally:
            del q, k, v, leaves
        res = {"fwd_s": fwd_s, "fwdbwd_s": fb_s, "fwd_mb": fwd_peak / 2**20}
        res["fwdbwd_mb"] = fb_peak / 2**20
        print(json.dumps({"length": n, **res}), flush=True)
        done.append(n)
        times.append(fb_s)
        mems.append(max(res["fwdbwd_mb"], 1.0))
        if fb_s > spec["max_seconds"]:
            stop = f"time: measured {fb_s:.0f}s > {spec['max_seconds']:.0f}s"


def _growth(values: list[float], lengths: list[int], floor: float) -> float:
    """Factor per doubling of L seen over the last two lengths (floor..8; 4 if unknown)."""
    if len(values) < 2 or values[-2] <= 0:
        return 4.0
    observed = (values[-1] / values[-2]) ** (1.0 / math.log2(lengths[-1] / lengths[-2]))
    return min(8.0, max(floor, observed))


# -- driver -------------------------------------------------------------------------------
def available(name: str, device: str, dtype: str) -> str | None:
    """None if backend `name` can run here, else the one-line reason it cannot."""
    import torch

    from litmt.attention import build_backend
    from litmt.attention.base import AttentionRequest
    from litmt.errors import LitmtError

    try:
        kernel = build_backend(name, **BACKENDS.get(name, {}))
        kernel.validate(
            AttentionRequest(causal=True, device=device, dtype=getattr(torch, DTYPES[dtype]))
        )
    except LitmtError as err:
        return str(err)
    return None


def run_sweep(spec: dict[str, Any], timeout: float, name: str) -> dict[int, dict[str, Any]]:
    """Run one worker; its cells by L ("skipped"/"error" where it stopped or died)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "benchmarks.benchmark_attention", "--worker", json.dumps(spec)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    cells: dict[int, dict[str, Any]] = {}
    deadline = time.perf_counter() + timeout
    mode = "causal" if spec["causal"] else "full"
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.perf_counter()))
        except queue.Empty:
            proc.kill()
            why = f"time: sweep exceeded {timeout:.0f}s"
            break
        if line is None:
            proc.wait()
            tail = (proc.stderr.read().strip().splitlines() or ["?"])[-1] if proc.stderr else "?"
            why = "out of memory (killed)" if proc.returncode in (-9, 137) else f"failed: {tail}"
            break
        if not line.startswith("{"):
            continue
        cell = json.loads(line)
        n = cell.pop("length")
        cells[n] = cell
        if "fwdbwd_s" in cell:
            print(
                f"  {name:8s} {mode:6s} L={n:6d}  fwd {cell['fwd_s'] * 1e3:9.1f} ms  "
                f"fwd+bwd {cell['fwdbwd_s'] * 1e3:9.1f} ms  peak {cell['fwdbwd_mb']:8.1f} MB",
                flush=True,
            )
        elif not any("skipped" in c for c in list(cells.values())[:-1]):
            print(f"  {name:8s} {mode:6s} L={n:6d}  stop: {cell['skipped']}", flush=True)
        if len(cells) == len(spec["lengths"]):
            proc.wait()
            return cells
    missing = [n for n in spec["lengths"] if n not in cells]
    for n in missing:
        cells[n] = {"skipped": why}
    if missing:
        print(f"  {name:8s} {mode:6s} L={missing[0]:6d}  stop: {why}", flush=True)
    return cells


def sweep(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """All sweeps of all `names`; returns {backend: {"True"/"False": {L: cell}}}."""
    results: dict[str, Any] = {}
    for name in names:
        results[name] = {}
        for causal in args.causal:
            spec = {
                "backend": name,
                "options": BACKENDS.get(name, {}),
                "lengths": args.lengths,
                "causal": causal,
                "device": args.device,
                "dtype": DTYPES[args.dtype],
                "batch": args.batch,
                "heads": args.heads,
                "dim": args.dim,
                "single_run": args.single_run,
                "warm_below": args.warm_below,
                "max_seconds": args.max_seconds,
                "max_memory_gb": args.max_memory_gb,
                "threads": args.threads,
            }
            results[name][str(causal)] = run_sweep(spec, args.sweep_timeout, name)
    return results


def _fmt_time(cell: dict[str, Any], key: str) -> str:
    if key not in cell:
        return "—"
    s = cell[key]
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


def _fmt_mem(cell: dict[str, Any], key: str) -> str:
    if key not in cell:
        return "—"
    return f"{cell[key]:.1f}" if cell[key] < 100 else f"{cell[key]:.0f}"


def tables(results: dict[str, Any], lengths: list[int], causal_modes: list[bool]) -> str:
    """Markdown: per mode, forward ms, forward+backward ms and peak MB by backend and L."""
    out = []
    header = "| backend | " + " | ".join(str(n) for n in lengths) + " |"
    rule = "|---|" + "---:|" * len(lengths)
    for causal in causal_modes:
        mode = "causal" if causal else "non-causal"
        for title, key, fmt in (
            ("forward time (ms)", "fwd_s", _fmt_time),
            ("forward+backward time (ms)", "fwdbwd_s", _fmt_time),
            ("peak memory of forward+backward (MB)", "fwdbwd_mb", _fmt_mem),
        ):
            out += [f"**{mode}, {title}**", "", header, rule]
            for name, by_mode in results.items():
                cells = by_mode[str(causal)]
                row = [fmt(cells.get(str(n), cells.get(n, {})), key) for n in lengths]
                out.append(f"| {name} | " + " | ".join(row) + " |")
            out.append("")
    return "\n".join(out)


def skipped_notes(results: dict[str, Any]) -> str:
    """One line per backend and mode saying why its sweep stopped, if it did."""
    lines = []
    for name, by_mode in results.items():
        for causal, cells in by_mode.items():
            for n, cell in cells.items():
                why = cell.get("skipped") or cell.get("error")
                if why:
                    mode = "causal" if causal == "True" else "non-causal"
                    lines.append(f"- {name}, {mode}: stopped from L={n} ({why})")
                    break
    return "\n".join(lines)


def claims(results: dict[str, Any]) -> str:
    """The three CPU claims of the issue, checked against the measured causal fwd+bwd cells."""

    def cell(name: str, n: int) -> dict[str, Any]:
        return results.get(name, {}).get("True", {}).get(n, {})

    lines = []
    checks = [
        ("sdpa >= 5x faster than math at L=4096", "math", "sdpa", 4096, 5.0),
        ("linear >= 10x faster than sdpa at L=32768", "sdpa", "linear", 32768, 10.0),
        ("local (w=256) faster than sdpa at L=16384", "sdpa", "local", 16384, 1.0),
    ]
    for text, slow, fast, n, factor in checks:
        a, b = cell(slow, n), cell(fast, n)
        if "fwdbwd_s" not in a or "fwdbwd_s" not in b:
            lines.append(f"- {text}: not measured")
            continue
        ratio = a["fwdbwd_s"] / b["fwdbwd_s"]
        ok = ratio >= factor
        lines.append(
            f"- {text}: {a['fwdbwd_s']:.2f}s vs {b['fwdbwd_s']:.2f}s = {ratio:.1f}x "
            f"({'yes' if ok else 'NO'})"
        )
        if slow == "math":
            mem = b["fwdbwd_mb"] / max(a["fwdbwd_mb"], 1e-9)
            lines.append(
                f"- sdpa peak memory <= 1/5 of math at L={n}: {b['fwdbwd_mb']:.0f} MB vs "
                f"{a['fwdbwd_mb']:.0f} MB = {mem:.3f} ({'yes' if mem <= 0.2 else 'NO'})"
            )
    return "\n".join(lines)


def plot(results: dict[str, Any], causal_modes: list[bool], path: Path, title: str) -> None:
    """Log-log fwd+bwd time and peak memory against L, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, len(causal_modes), figsize=(5 * len(causal_modes), 7), squeeze=False
    )
    for col, causal in enumerate(causal_modes):
        for name, by_mode in results.items():
            cells = {int(n): c for n, c in by_mode[str(causal)].items() if "fwdbwd_s" in c}
            if not cells:
                continue
            xs = sorted(cells)
            axes[0][col].plot(xs, [cells[x]["fwdbwd_s"] for x in xs], marker="o", label=name)
            axes[1][col].plot(
                xs, [max(cells[x]["fwdbwd_mb"], 0.1) for x in xs], marker="o", label=name
            )
        mode = "causal" if causal else "non-causal"
        axes[0][col].set_title(f"{mode}: forward+backward time")
        axes[1][col].set_title(f"{mode}: peak memory")
        axes[0][col].set_ylabel("seconds")
        axes[1][col].set_ylabel("MB")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def machine(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="fp32 on CPU, bf16 on CUDA")
    p.add_argument("--backends", nargs="*", default=None, help="default: all available")
    p.add_argument("--lengths", nargs="*", type=int, default=DEFAULT_LENGTHS)
    p.add_argument("--causal", nargs="*", default=["false", "true"], choices=["false", "true"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-seconds", type=float, default=45.0, help="time budget of one measurement")
    p.add_argument("--max-memory-gb", type=float, default=8.0, help="memory budget of one cell")
    p.add_argument("--sweep-timeout", type=float, default=300.0, help="kill one sweep after (s)")
    p.add_argument("--single-run", type=float, default=2.0, help="one timed call above this (s)")
    p.add_argument("--warm-below", type=int, default=8192, help="warm-up call for L <= this")
    p.add_argument(
        "--out", default="-", help="output folder (docs: the guide's figure), or - to print only"
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.causal = [c == "true" for c in args.causal]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return 0
    names = args.backends if args.backends else list(BACKENDS)
    runnable, unavailable = [], {}
    for name in names:
        reason = available(name, args.device, args.dtype)
        if reason is None:
            runnable.append(name)
        else:
            unavailable[name] = reason
    import torch

    from litmt.attention.backends.auto import choose_backend

    auto = choose_backend(args.device, getattr(torch, DTYPES[args.dtype]))
    print(f"# attention benchmark on {machine(args.device)}", flush=True)
    for name, reason in unavailable.items():
        print(f"  {name:8s} unavailable: {reason}", flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t0 = time.perf_counter()
    results = sweep(args, runnable)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    title = (
        f"B={args.batch} H={args.heads} D={args.dim} {args.dtype}, {args.device} "
        f"({machine(args.device)})"
    )
    text = "\n".join(
        [
            f"Attention kernels alone, {title}. Sweep wall time {wall / 60:.1f} min; "
            f"1-min load average {load_before:.1f} before, {load_after:.1f} after "
            "(other processes share this machine, so times carry some noise).",
            f"`auto` resolves to `{auto}` here. Options: local window=256; sparse fixed, "
            "block 64, stride 4; flex compiled"
            + (
                " (on CPU only its forward: torch has no CPU backward for flex, so its "
                "forward+backward runs the same mask densely through sdpa)."
                if args.device == "cpu"
                else "."
            ),
            "Times under 1 s are medians of a few calls; longer ones single calls. Peak "
            "memory is that of the call: its inputs excluded, their gradients included.",
            "",
            tables(results, args.lengths, args.causal),
            "Stopped sweeps (time/memory budget):" if skipped_notes(results) else "",
            skipped_notes(results),
            "",
            "Unavailable here: "
            + ("; ".join(f"`{n}` ({r})" for n, r in unavailable.items()) or "none"),
            "",
            "Claims (causal forward+backward):",
            claims(results),
            "",
        ]
    )
    print(text)
    if args.out != "-":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention_benchmark.json").write_text(json.dumps(results, indent=1))
        (out / "attention_benchmark.md").write_text(
            f"## Attention backends ({args.device.upper()})\n\n{text}\n"
            "![attention benchmark](attention_benchmark.png)\n"
        )
        try:
            plot(results, args.causal, out / "attention_benchmark.png", title)
        except ImportError:
            print("matplotlib is not installed: no plot")
        print(f"wrote {out}/attention_benchmark.md, attention_benchmark.png, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
