"""Work no one waits for stops: a real server on loopback, one large request whose client
hangs up, then a plain request. Prints how long the plain request waited, against how long the
large request's decode takes when its client stays.

Per engine (a ``.ckpt`` is served by the torch engine, a CTranslate2 export by ct2): the server
starts with limits raised to take `--sentences` lines in one request (a batch of its own); the
large request is timed once to the end, then sent again with a client that hangs up after
`--hang-up` seconds; `--plain` one-line requests follow and their latency is the table's. The
server's ``/health`` ``stopped`` counts the batches it stopped.

    python -m benchmarks.server_stop --model exports/int8 --src ../shared/data/multi30k/test2016.en
    python -m benchmarks.server_stop --model model.ckpt --model exports/int8 --src S --record server_stop
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.benchmark_server import server_process
from benchmarks.common import write_result_record
from litmt.cli.script.exits import cli_errors
from litmt.data.text import read_text_file


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="a .ckpt or an export")
    p.add_argument("--src", required=True, help="sentences, one per line")
    p.add_argument("--sentences", type=int, default=2000, help="lines of the large request")
    p.add_argument("--beam", type=int, default=5, help="the server's beam size")
    p.add_argument("--threads", type=int, default=2, help="the server's CPU threads")
    p.add_argument("--hang-up", type=float, default=0.5, help="seconds before the client goes")
    p.add_argument("--plain", type=int, default=5, help="plain requests after the hang-up")
    p.add_argument("--record", help="also write the result record docs/results/records/<ID>.json")
    return p.parse_args(argv)


def measure(model: str, lines: list[str], args: argparse.Namespace) -> dict[str, float | str]:
    """One engine's row: the large decode's seconds, the plain requests' latency after the
    hang-up, the server's ``stopped``."""
    n = len(lines)
    chars = sum(len(s) for s in lines)
    limits = [
        f"max_texts={n}", f"max_lines={n}", f"max_chars={chars + n}",
        f"max_body_bytes={4 * chars + 64 * n}", f"max_batch_sentences={n}",
        f"max_source_tokens={4 * chars}", "request_timeout_s=600",
    ]  # fmt: skip
    server = argparse.Namespace(
        model=model, engine="torch" if model.endswith(".ckpt") else "ct2",
        threads=args.threads, beam=args.beam, explorer=False, serve_arg=limits,
    )  # fmt: skip
    with server_process(server) as (url, _pid):
        langs = httpx.get(url + "/languages", timeout=10).json()
        source = next(lang for lang in langs if lang["targets"])
        src, tgt = source["code"], source["targets"][0]
        one = {"q": lines[0], "source": src, "target": tgt}
        for _ in range(3):  # warm-up
            httpx.post(url + "/translate", json=one, timeout=60).raise_for_status()
        large = {"q": lines, "source": src, "target": tgt}
        t0 = time.monotonic()
        answer = httpx.post(url + "/translate", json=large, timeout=600)
        full_s = time.monotonic() - t0
        if answer.status_code != 200:
            raise SystemExit(f"the large request got {answer.status_code}: {answer.text[:300]}")
        try:
            httpx.post(url + "/translate", json=large, timeout=args.hang_up)
            raise SystemExit(
                f"the large request answered within {args.hang_up} s: raise --sentences"
            )
        except httpx.TimeoutException:
            pass  # the client hangs up: its connection closes
        waits = []
        for _ in range(args.plain):
            t0 = time.monotonic()
            httpx.post(url + "/translate", json=one, timeout=600).raise_for_status()
            waits.append(time.monotonic() - t0)
        health = httpx.get(url + "/health", timeout=10).json()
    return {
        "engine": server.engine,
        "full_s": full_s,
        "first_plain_s": waits[0],
        "median_plain_s": statistics.median(waits),
        "stopped": float(health.get("stopped", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        sentences = [s for s in read_text_file(args.src, "--src") if s.strip()]
    lines = (sentences * (args.sentences // max(1, len(sentences)) + 1))[: args.sentences]
    rows = {model: measure(model, lines, args) for model in args.model}
    print(
        f"\n{args.sentences} lines in one request, beam {args.beam}, {args.threads} server "
        f"threads; its client hangs up after {args.hang_up} s, then {args.plain} one-line "
        "requests\n"
    )
    print(
        "| model | engine | large request alone (s) | first one-line request after the "
        "hang-up (s) | median of the one-line requests (s) | batches stopped |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for model, r in rows.items():
        print(
            f"| {Path(model).name} | {r['engine']} | {r['full_s']:.2f} | "
            f"{r['first_plain_s']:.3f} | {r['median_plain_s']:.3f} | {r['stopped']:.0f} |"
        )
    if args.record:
        values: dict[str, float] = {}
        units: dict[str, str] = {}
        for r in rows.values():
            e = r["engine"]
            for key in ("full_s", "first_plain_s", "median_plain_s"):
                values[f"{e}_{key}"], units[f"{e}_{key}"] = round(float(r[key]), 3), "s"
            values[f"{e}_stopped"] = r["stopped"]
        argv = sys.argv[1:] if argv is None else argv
        path = write_result_record(
            args.record,
            "Work no one waits for stops: a one-line request after a large one's client hung up",
            "benchmarks.server_stop",
            argv,
            values,
            units,
            notes=f"{args.sentences} lines in the large request, beam {args.beam}, "
            f"{args.threads} server threads, hang-up after {args.hang_up} s",
        )
        print(f"result record: {path}")
    return 0 if all(r["stopped"] >= 1 for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
