"""Benchmark the data pipeline at WMT scale: preparation and batch iteration with bounded memory.

Synthetic corpora (`generate`): Zipf-distributed words (exponent 1.1) from a 32k-word
vocabulary per language, log-normal sentence lengths (median 20 words, like WMT news
text), target lengths within a log-normal factor of the source. For each size it measures,
each step in a fresh child process polled from outside (``/proc/PID/status``):

- preparation (`prepare_data`: tokenizer training on a bounded sample, tokenisation,
  filtering, the cache): wall time, peak RSS of the process tree, size of the cache on disk;
- one epoch of training batches with no model (`setup("fit")` + the train DataLoader):
  peak RSS, split into anonymous (private) memory and file-backed pages (the
  memory-mapped cache the epoch touches);
- 2-rank gloo (`--ddp`): each rank's first 100 batches hashed (example indexes and the
  collated tensors) and its private memory (RssAnon, USS).

    python -m benchmarks.data_scale --root SCALE --sizes 1000000 4000000 10000000
    python -m benchmarks.data_scale --root SCALE --sizes 1000000 --ddp --no-iterate
    python -m benchmarks.data_scale --root R --out report.md   # markdown for a lab notebook page (docs/notebook/)

Timings depend on what else runs on the machine; say so when quoting them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_WORDS = 32_000  # distinct words per language
ZIPF_S = 1.1  # Zipf exponent of word frequencies
VALID_PAIRS = 1000  # pairs in the synthetic valid and test splits
HASH_BATCHES = 100  # batches per rank hashed under DDP


# -- the synthetic corpus ------------------------------------------------------------------
def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` distinct pseudo-words made of 2-4 syllables."""
    syll = np.array([c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ei")])
    words: dict[str, None] = {}
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words["".join(syll[rng.integers(0, len(syll), k)]) + ("" if k > 1 else str(len(words)))] = (
            None
        )
    return np.array(list(words)[:n], dtype=object)


def _write_side(path: Path, words: np.ndarray, lengths: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    p = ranks**-ZIPF_S
    cdf = np.cumsum(p / p.sum())
    with path.open("w", encoding="utf-8") as f:
        for a in range(0, len(lengths), 100_000):
            lens = lengths[a : a + 100_000]
            ids = np.minimum(np.searchsorted(cdf, rng.random(int(lens.sum()))), len(words) - 1)
            toks = words[ids]
            bounds = np.concatenate([[0], np.cumsum(lens)])
            f.write(
                "".join(" ".join(toks[bounds[i] : bounds[i + 1]]) + "\n" for i in range(len(lens)))
            )


def generate(out: Path, pairs: int, seed: int = 0) -> None:
    """Write `out/{train,valid,test}.{en,de}` (skipped when already complete)."""
    done = out / ".complete"
    if done.exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    en, de = _words(rng, VOCAB_WORDS), _words(np.random.default_rng(seed + 1), VOCAB_WORDS)
    for split, n in (("train", pairs), ("valid", VALID_PAIRS), ("test", VALID_PAIRS)):
        src = np.clip(np.round(rng.lognormal(np.log(20), 0.6, n)), 1, 150).astype(np.int64)
        tgt = np.clip(np.round(src * rng.lognormal(0, 0.15, n)), 1, 180).astype(np.int64)
        _write_side(out / f"{split}.en", en, src, seed + 10 + len(split))
        _write_side(out / f"{split}.de", de, tgt, seed + 20 + len(split))
    done.write_text("ok\n")


# -- what each child process runs ----------------------------------------------------------
def dm_kwargs(corpus: Path, cache: Path, input_sentence_size: int) -> dict[str, Any]:
    """The DataModule settings of every measurement (the same before and after a change)."""
    return {
        "name": "scale",
        "dir": str(corpus),
        "src_lang": "en",
        "tgt_lang": "de",
        "tokenizer": {"vocab_size": 32_000, "input_sentence_size": input_sentence_size},
        "cache_dir": str(cache),
        "max_tokens": 4096,
        "num_workers": 0,
        "num_proc": 2,
        "seed": 0,
    }


def _status() -> dict[str, int]:
    """RssAnon, RssFile, VmHWM of this process in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
            out[key] = int(val.split()[0]) * 1024
    return out


class _Events(logging.Handler):
    """The wall-clock time of each litmt log line of a child (where the phases begin)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((time.time(), record.getMessage()[:80]))


def child_prepare(kw: dict[str, Any]) -> dict[str, Any]:
    from litmt.data import TranslationDataModule

    events = _Events()
    logging.getLogger("litmt").addHandler(events)
    logging.getLogger("litmt").setLevel(logging.INFO)
    t0 = time.perf_counter()
    dm = TranslationDataModule(**kw)
    dm.prepare_data()
    return {"prep_s": time.perf_counter() - t0, **_status(), "events": events.events,
            "children_maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}  # fmt: skip


# Where each phase of preparation begins: the first log line starting with this text.
PHASES = (
    ("sample", "tokenizer: training sentencepiece"),  # two passes: count, write the sample
    ("sentencepiece", "tokenizer: sampled"),  # sentencepiece trains on the sample
    ("tokenise", "tokenizer: trained"),  # every split tokenised into the cache
)


def phase_peaks(
    timeline: list[tuple[float, int]], events: list[tuple[float, str]]
) -> dict[str, tuple[float, int]]:
    """Per phase of `PHASES` that the events show, (seconds, peak summed RSS of the process
    tree), from the parent's polled `timeline` of (time, RSS) and the child's log `events`."""
    starts = []
    for name, prefix in PHASES:
        t = next((t for t, msg in events if msg.startswith(prefix)), None)
        if t is not None:
            starts.append((name, t))
    end = timeline[-1][0] if timeline else 0.0
    out = {}
    for k, (name, a) in enumerate(starts):
        b = starts[k + 1][1] if k + 1 < len(starts) else end
        out[name] = (b - a, max((r for t, r in timeline if a <= t < b), default=0))
    return out


def child_iterate(kw: dict[str, Any]) -> dict[str, Any]:
    from litmt.data import TranslationDataModule

    dm = TranslationDataModule(**kw)
    dm.setup("fit")
    after_setup = _status()
    t0 = time.perf_counter()
    batches = tokens = 0
    for b in dm.train_dataloader():
        batches += 1
        tokens += int(b["ntokens"])
    return {"iter_s": time.perf_counter() - t0, "batches": batches, "tokens": tokens,
            "setup_anon": after_setup["RssAnon"], **_status()}  # fmt: skip


def child_ddp_rank(kw: dict[str, Any]) -> dict[str, Any]:
    import psutil
    import torch.distributed as dist

    from litmt.data import TranslationDataModule

    dist.init_process_group("gloo")
    dm = TranslationDataModule(**kw)
    dm.setup("fit")
    loader = dm.train_dataloader()
    h_idx, h_all = hashlib.sha256(), hashlib.sha256()
    for i, b in enumerate(loader):
        if i == HASH_BATCHES:
            break
        idx = b["index"].numpy().astype(np.int64)
        h_idx.update(idx.tobytes() + b"|")
        h_all.update(idx.tobytes())
        for key in ("src", "tgt_in", "tgt_out"):
            t = b[key].numpy().astype(np.int64)
            h_all.update(repr(t.shape).encode() + t.tobytes())
    out = {"rank": dist.get_rank(), "batches_per_rank": len(loader),
           "index_hash": h_idx.hexdigest()[:16], "batch_hash": h_all.hexdigest()[:16],
           "uss": psutil.Process().memory_full_info().uss, **_status()}  # fmt: skip
    dist.destroy_process_group()
    return out


# -- the parent: run a child, poll its memory -----------------------------------------------
def _tree_rss(pid: int) -> tuple[int, int, int]:
    """(RssAnon of `pid`, RssFile of `pid`, summed RSS of `pid` and its descendants)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, val = line.partition(":")
            fields[key] = val
        anon = int(fields.get("RssAnon", "0 kB").split()[0]) * 1024
        file_ = int(fields.get("RssFile", "0 kB").split()[0]) * 1024
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return anon, file_, total
    except (psutil.Error, OSError):
        return 0, 0, 0


def run_child(mode: str, kw: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `mode` in a child process; its JSON result plus polled peaks."""
    cmd = [sys.executable, "-m", "benchmarks.data_scale", "--child", mode, json.dumps(kw)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env or os.environ.copy(), text=True)
    peak = [0, 0, 0]
    timeline = []  # (time, summed RSS of the process tree)
    while proc.poll() is None:
        rss = _tree_rss(proc.pid)
        timeline.append((time.time(), rss[2]))
        for i, v in enumerate(rss):
            peak[i] = max(peak[i], v)
        time.sleep(0.05)
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{mode} child failed (exit {proc.returncode})")
    res = json.loads(out.strip().splitlines()[-1])
    res.update(peak_anon=peak[0], peak_file=peak[1], peak_tree=peak[2])
    if "events" in res:
        res["phases"] = phase_peaks(timeline, res.pop("events"))
    return res


def run_ddp(kw: dict[str, Any], world: int = 2) -> list[dict[str, Any]]:
    """`world` gloo ranks on this machine, each hashing its first batches."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}  # fmt: skip
    procs = []
    for r in range(world):
        cmd = [sys.executable, "-m", "benchmarks.data_scale", "--child", "ddp", json.dumps(kw)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}))  # fmt: skip
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"ddp rank failed (exit {p.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", nargs=2, metavar=("MODE", "KWARGS"), help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, help="folder for the corpora and caches (not the repo)")
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000, 10_000_000])
    p.add_argument("--input-sentence-size", type=int, default=1_000_000,
                   help="sentences sampled for sentencepiece (data.tokenizer.input_sentence_size)")  # fmt: skip
    p.add_argument("--ddp", action="store_true", help="also 2-rank gloo on the first size")
    p.add_argument("--no-iterate", action="store_true", help="skip the one-epoch iteration")
    p.add_argument("--keep-cache", action="store_true", help="reuse an existing cache")
    p.add_argument("--out", default="-", help="markdown report path, or - for stdout only")
    return p


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per corpus size, the DDP ranks' rows) of the runs `args` asks for."""
    rows, ddp_rows = [], []
    for n in args.sizes:
        corpus, cache = args.root / f"corpus-{n}", args.root / f"cache-{n}"
        t0 = time.perf_counter()
        generate(corpus, n)
        print(f"[{n}] corpus ready ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
        if cache.exists() and not args.keep_cache:
            shutil.rmtree(cache)
        kw = dm_kwargs(corpus, cache, args.input_sentence_size)
        prep = run_child("prepare", kw)
        size = _du(cache / "cache") if (cache / "cache").exists() else _du(cache)
        row = {"pairs": n, "prep_s": prep["prep_s"], "prep_peak": prep["VmHWM"],
               "prep_tree_peak": prep["peak_tree"], "disk": size,
               "phases": prep["phases"]}  # fmt: skip
        print(f"[{n}] prepared: {json.dumps(prep)}", file=sys.stderr)
        it = None
        if not args.no_iterate:
            it = run_child("iterate", kw)
            print(f"[{n}] iterated: {json.dumps(it)}", file=sys.stderr)
            row.update(iter_s=it["iter_s"], batches=it["batches"], iter_peak=it["VmHWM"],
                       iter_anon=it["peak_anon"], iter_file=it["peak_file"])  # fmt: skip
        rows.append(row)
        if args.ddp and n == args.sizes[0]:
            single = it if it is not None else run_child("iterate", kw)
            for r in run_ddp(kw):
                ddp_rows.append({**r, "pairs": n, "single_anon": single["peak_anon"]})
                print(f"[{n}] ddp rank: {json.dumps(r)}", file=sys.stderr)
    return rows, ddp_rows


def report(rows: list[dict[str, Any]], ddp_rows: list[dict[str, Any]], sample: int) -> str:
    """The markdown tables of `measure`'s rows (`sample`: the tokenizer's sentence sample)."""
    lines = [
        "| pairs | prep time (s) | prep peak RSS (GiB, main / tree) | cache on disk (GiB) | "
        "epoch: batches | epoch time (s) | epoch peak RSS (GiB) | epoch peak RssAnon (GiB) | "
        "epoch peak RssFile (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['pairs']:,} | {r['prep_s']:.0f} | {_gb(r['prep_peak'])} / "
            f"{_gb(r['prep_tree_peak'])} | {_gb(r['disk'])} | {r.get('batches', '-')} | "
            f"{r.get('iter_s', 0):.0f} | {_gb(r.get('iter_peak', 0))} | "
            f"{_gb(r.get('iter_anon', 0))} | {_gb(r.get('iter_file', 0))} |"
        )
    names = [name for name, _ in PHASES]
    lines += ["", f"Preparation by phase (input_sentence_size={sample:,}): seconds / peak RSS "
              "of the process tree (GiB)", "",
              "| pairs | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]  # fmt: skip
    for r in rows:
        cells = [r["phases"].get(name) for name in names]
        lines.append(f"| {r['pairs']:,} | " + " | ".join(
            "-" if c is None else f"{c[0]:.0f} / {_gb(c[1])}" for c in cells) + " |")  # fmt: skip
    if ddp_rows:
        lines += ["", "| rank | batches | index hash | batch hash | RssAnon (GiB) | USS (GiB) | "
                  "single-process RssAnon (GiB) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in ddp_rows:
            lines.append(
                f"| {r['rank']} | {r['batches_per_rank']} | `{r['index_hash']}` | "
                f"`{r['batch_hash']}` | {_gb(r['RssAnon'])} | {_gb(r['uss'])} | "
                f"{_gb(r['single_anon'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.child:
        mode, kw = args.child[0], json.loads(args.child[1])
        fn = {"prepare": child_prepare, "iterate": child_iterate, "ddp": child_ddp_rank}[mode]
        print(json.dumps(fn(kw)), flush=True)
        return 0
    if args.root is None:
        p.error("--root is required")
    text = report(*measure(args), args.input_sentence_size)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
