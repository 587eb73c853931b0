"""Load test of scripts/serve.py on loopback: requests/s, p50/p95/p99 latency and answers by
status code per concurrency, and a soak with the server's RSS every `--rss-every` seconds.

The server runs in its own process (as deployed). The clients are asyncio connections
(`benchmarks.http_load`), one kept alive per client, each client on its own loopback
address (distinct users), each with one request in flight (one sentence per request,
cycling through --src) until the level's `--requests` are answered or `--max-seconds`
pass. A client that gets 503/429 waits its Retry-After. `--soak S` then keeps
`--soak-concurrency` clients busy for S seconds (`--mix`: plain, alternatives=3, prefix,
/attention, bad input and clients that hang up) and samples the server's RSS (psutil).
Prints markdown tables.

    python -m benchmarks.benchmark_server --model model.ckpt --src ../shared/data/multi30k/test2016.en
    python -m benchmarks.benchmark_server --model exports/int8 --threads 2 --concurrency 1 8 32
    python -m benchmarks.benchmark_server --model model.ckpt --src S --smoke      # seconds
    python -m benchmarks.benchmark_server --model M.ckpt --src S --engine ct2 --explorer \
        --serve-arg compute_type=int8 --concurrency 1 --soak 600 --soak-concurrency 64 --mix
    python -m benchmarks.benchmark_server --url http://127.0.0.1:5000 --src S      # a running server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.common import REPO, write_result_record
from benchmarks.http_load import mixed_requests, plain_requests, run_clients, summary
from litmt.cli.script.exits import cli_errors
from litmt.data.text import read_text_file


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default=None, help="a .ckpt or a CTranslate2 export to serve")
    p.add_argument("--url", default=None, help="benchmark this running server instead")
    p.add_argument("--src", required=True, help="sentences to send, one per line")
    p.add_argument("--engine", default="torch", help="torch | ct2 (an export is always ct2)")
    p.add_argument("--threads", type=int, default=2, help="the server's CPU threads")
    p.add_argument("--beam", type=int, default=5, help="the server's beam size")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--requests", type=int, default=256, help="requests per concurrency level")
    p.add_argument("--max-seconds", type=float, default=120.0, help="bound of one level")
    p.add_argument("--soak", type=float, default=0.0, help="then a soak of this many seconds")
    p.add_argument("--soak-concurrency", type=int, default=32, help="clients during the soak")
    p.add_argument("--rss-every", type=float, default=30.0, help="RSS sample period (soak)")
    p.add_argument("--server-pid", type=int, default=None, help="with --url: its PID for RSS")
    p.add_argument("--mix", action="store_true", help="soak with mixed traffic (http_load)")
    p.add_argument("--explorer", action="store_true", help="serve /attention (a .ckpt only)")
    p.add_argument(
        "--serve-arg", action="append", default=[], help="more scripts/serve.py overrides"
    )
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument(
        "--record",
        default=None,
        help="also write the result record docs/results/records/<ID>.json (litmt.records)",
    )
    p.add_argument("--smoke", action="store_true", help="concurrency 1 and 4, 8 requests each")
    args = p.parse_args(argv)
    if args.smoke:
        args.concurrency, args.requests, args.beam, args.max_seconds = [1, 4], 8, 1, 60.0
    if (args.model is None) == (args.url is None):
        p.error("give exactly one of --model and --url")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """Start scripts/serve.py on a free loopback port; yield its URL and PID; stop it."""
    port = free_port()
    cmd = [
        sys.executable, str(REPO / "scripts" / "serve.py"), f"ckpt_path={args.model}",
        f"engine={args.engine}", f"threads={args.threads}", f"port={port}", "host=127.0.0.1",
        "log_level=warning", f"decoding.beam_size={args.beam}",
        f"explorer={str(args.explorer).lower()}", *args.serve_arg,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # torch's intra-op threads
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {proc.stderr.read().strip()}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start within 180 s")
            time.sleep(0.3)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_level(url: str, make, concurrency: int, n: int, bound: float) -> dict[str, object]:
    """`concurrency` clients, each one request in flight, until `n` answers or `bound` s.

    Every answer is counted by its status code (``status``: {"200": k, "503": m, ...});
    a connection that fails without an answer counts as ``"conn"``. Latency percentiles
    are of the 200s."""
    tally, wall = asyncio.run(run_clients(url, make, concurrency, n, bound))
    if not tally.latencies:
        raise SystemExit(f"no request succeeded at concurrency {concurrency} ({tally.totals()})")
    return summary(tally, wall, concurrency)


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid` and its children, in MiB."""
    import psutil

    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs) / 2**20


def soak(url: str, pid: int | None, make, args) -> dict:
    """`args.soak` seconds at `args.soak_concurrency`, sampling the server's RSS."""
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while pid is not None and not done.wait(args.rss_every):
            samples.append((time.monotonic() - start, rss_mb(pid)))

    before = rss_mb(pid) if pid is not None else None
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    row = run_level(url, make, args.soak_concurrency, 10**9, args.soak)
    done.set()
    sampler.join()
    after = rss_mb(pid) if pid is not None else None
    return {**row, "rss_before_mb": before, "rss_after_mb": after, "rss_samples": samples}


def _codes(status: dict[str, int]) -> str:
    return ", ".join(f"{code}: {k}" for code, k in status.items())


def _answered(status: dict[str, int]) -> bool:
    """Every request got an answer, and no 5xx but 503 (which carries Retry-After)."""
    return all(code in ("hung up", "503") or not code.startswith(("5", "conn")) for code in status)


def _goals(rows: list[dict]) -> str:
    """The load goals: throughput at 128 and 512 against 32, and 32's own."""
    by = {r["concurrency"]: r["requests_per_s"] for r in rows}
    lines = []
    if 32 in by:
        lines.append(f"\nconcurrency 32: {by[32]:.1f} requests/s (goal >= 150 on 2 cores)")
        for c in (128, 512):
            if c in by:
                lines.append(
                    f"concurrency {c}: {100 * by[c] / by[32]:.0f} % of 32's (goal >= 90 %)"
                )
    bad = [r["concurrency"] for r in rows if not _answered(r["status"])]
    lines.append("5xx other than 503, or unanswered: " + (f"at {bad}" if bad else "none"))
    return "\n".join(lines)


def _soak_report(soaked: dict, concurrency: int) -> str:
    """The soak's table, its answers by kind, and RSS growth after the first minute."""
    before, after = soaked["rss_before_mb"], soaked["rss_after_mb"]
    samples = soaked["rss_samples"]
    after_minute = next((m for t, m in samples if t >= 59), None)
    growth = (
        "n/a"
        if after_minute is None or after is None
        else f"{100 * (after - after_minute) / after_minute:+.1f} %"
    )
    fmt = lambda v: "n/a" if v is None else f"{v:.0f}"  # noqa: E731
    out = [
        f"\nSoak: {soaked['seconds']:.0f} s at concurrency {concurrency}\n",
        "| requests (200) | 200s/s | p50 (ms) | p95 (ms) | p99 (ms) | answers by status | "
        "RSS before (MiB) | at 1 min | after | growth after 1 min |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        f"| {soaked['requests']} | {soaked['requests_per_s']:.1f} | {soaked['p50_ms']:.0f} | "
        f"{soaked['p95_ms']:.0f} | {soaked['p99_ms']:.0f} | {_codes(soaked['status'])} | "
        f"{fmt(before)} | {fmt(after_minute)} | {fmt(after)} | {growth} |",
        "\n| kind | answers by status |\n|---|---|",
    ]
    out += [f"| {kind} | {_codes(codes)} |" for kind, codes in sorted(soaked["by_kind"].items())]
    if samples:
        out.append("\nRSS samples (s, MiB): " + ", ".join(f"{t:.0f}: {m:.0f}" for t, m in samples))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        sentences = [s for s in read_text_file(args.src, "--src") if s.strip()]
    with (
        server_process(args) if args.model else _running(args.url, args.server_pid) as (
            url,
            pid,
        )
    ):
        langs = httpx.get(url + "/languages", timeout=10).json()
        source = next(lang for lang in langs if lang["targets"])
        src, tgt = source["code"], source["targets"][0]
        prefixes = []
        for s in sentences[:8]:  # warm-up; each output's first word is a prefix of the mix
            body = {"q": s, "source": src, "target": tgt}
            out = httpx.post(url + "/translate", json=body, timeout=60).json()["translatedText"]
            prefixes.append(out.split()[0] if out.split() else out)
        health = httpx.get(url + "/health", timeout=10).json()
        plain = plain_requests(sentences, src, tgt)
        rows = [run_level(url, plain, c, args.requests, args.max_seconds) for c in args.concurrency]
        make = mixed_requests(sentences, prefixes, src, tgt) if args.mix else plain
        soaked = soak(url, pid, make, args) if args.soak > 0 else None
    what = args.model or args.url
    print(
        f"{what} ({health['engine']} engine), beam {args.beam}, {args.threads} server threads, "
        f"one sentence per request, {args.requests} requests per level (bounded at "
        f"{args.max_seconds:.0f} s), loopback\n"
    )
    print(
        "| concurrency | requests | requests/s | p50 (ms) | p95 (ms) | p99 (ms) | "
        "answers by status |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['requests']} | {r['requests_per_s']:.1f} | "
            f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {_codes(r['status'])} |"
        )
    ok = all(_answered(r["status"]) for r in rows)
    print(_goals(rows))
    if soaked is not None:
        print(_soak_report(soaked, args.soak_concurrency))
        ok = ok and _answered(soaked["status"])
    if args.json:
        out = {"args": vars(args), "rows": rows, "soak": soaked}
        Path(args.json).write_text(json.dumps(out, indent=2))
    if args.record:
        values, units = record_values(rows, soaked)
        argv = sys.argv[1:] if argv is None else argv
        title = f"Server load: {what} ({health['engine']} engine), beam {args.beam}, loopback"
        path = write_result_record(
            args.record, title, "benchmarks.benchmark_server", argv, values, units,
            notes=f"{args.threads} server threads, one sentence per request, {args.requests} "
            f"requests per level (bounded at {args.max_seconds:.0f} s); non_ok = answers other "
            "than 200",
        )  # fmt: skip
        print(f"result record: {path}")
    return 0 if ok else 1


def record_values(rows: list[dict], soaked: dict | None) -> tuple[dict, dict]:
    """The load table (and soak) as a result record's values and units."""
    values: dict[str, float] = {}
    units: dict[str, str] = {}
    for r in rows:
        c = r["concurrency"]
        values[f"c{c}_requests_per_s"], units[f"c{c}_requests_per_s"] = (
            r["requests_per_s"],
            "requests/s",
        )
        for q in ("p50", "p99"):
            values[f"c{c}_{q}_ms"], units[f"c{c}_{q}_ms"] = round(r[f"{q}_ms"]), "ms"
        values[f"c{c}_non_ok"] = sum(k for code, k in r["status"].items() if code != "200")
    by = {r["concurrency"]: r["requests_per_s"] for r in rows}
    for c in (128, 512):
        if 32 in by and c in by:
            values[f"c{c}_vs_c32_pct"] = round(100 * by[c] / by[32], 1)
            units[f"c{c}_vs_c32_pct"] = "%"
    if soaked is not None:
        values["soak_s"], units["soak_s"] = round(soaked["seconds"]), "s"
        values["soak_ok_requests"] = soaked["requests"]
        values["soak_requests_per_s"] = round(soaked["requests_per_s"], 1)
        units["soak_requests_per_s"] = "requests/s"
        values["soak_p99_ms"], units["soak_p99_ms"] = round(soaked["p99_ms"]), "ms"
        values["soak_5xx"] = sum(
            k for code, k in soaked["status"].items() if code.startswith("5") and code != "503"
        )
        after_minute = next((m for t, m in soaked["rss_samples"] if t >= 59), None)
        if after_minute and soaked["rss_after_mb"]:
            values["soak_rss_at_1min_mib"] = round(after_minute)
            values["soak_rss_after_mib"] = round(soaked["rss_after_mb"])
            growth = 100 * (soaked["rss_after_mb"] - after_minute) / after_minute
            values["soak_rss_growth_pct"], units["soak_rss_growth_pct"] = round(growth, 1), "%"
    return values, units


@contextmanager
def _running(url: str, pid: int | None) -> Iterator[tuple[str, int | None]]:
    yield url.rstrip("/"), pid


if __name__ == "__main__":
    sys.exit(main())
