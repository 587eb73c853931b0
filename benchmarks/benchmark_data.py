"""Benchmark the data pipeline on local parallel text (default `../shared/data/multi30k`).

Measures, in a fresh cache directory:
- the first (cold) `prepare_data` + `setup("fit")`: read files, train sentencepiece,
  tokenise all splits (streamed, in `num_proc` processes), write the memory-mapped caches;
- the second (cached) run of the same, in a new process-level object;
- batches per epoch and the padding fraction of token-budget bucketing versus plain
  batching (token budget without sorting, and a fixed sentence count with the same mean
  batch size), measured on the real padded tensors that `collate` produces;
- how long one epoch of the train DataLoader takes to iterate.

    python -m benchmarks.benchmark_data                          # prints a markdown report
    python -m benchmarks.benchmark_data --out report.md   # the tables of a lab notebook page (docs/notebook/)
    python -m benchmarks.benchmark_data --dir PATH --src en --tgt de --test-split test2016

Timing runs should not overlap other heavy jobs (wrap in `flock /tmp/litmt_cpu.lock ...`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from benchmarks.common import MULTI30K
from litmt.data import TranslationDataModule
from litmt.data.batching.collate import collate
from litmt.data.batching.sampler import TokenBudgetBatchSampler
from litmt.errors import LitmtError


def padding_stats(dm: TranslationDataModule, sampler: TokenBudgetBatchSampler) -> dict[str, float]:
    """Batches, mean sentences and padding fraction (src + tgt_out tensors) of one epoch."""
    ds = dm.datasets["train"]
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate)
    real = padded = sentences = 0
    batches = 0
    max_cost = 0
    for b in loader:
        src, tgt = b["src"], b["tgt_out"]
        real += int(b["src_lengths"].sum()) + int(b["tgt_lengths"].sum())
        padded += src.numel() + tgt.numel()
        sentences += src.shape[0]
        max_cost = max(max_cost, src.shape[0] * max(src.shape[1], tgt.shape[1]))
        batches += 1
    return {
        "batches": batches,
        "sentences": sentences / batches,
        "padding": 1 - real / padded,
        "max_cost": max_cost,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default=str(MULTI30K), help="folder with {split}.{lang} files")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--test-split", default="test2016", help="file stem of the test split")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--num-proc", type=int, default=1, help="tokenising processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="-", help="markdown report path, or - for stdout only")
    return p


def prepare_twice(
    args: argparse.Namespace, cache: str
) -> tuple[TranslationDataModule, dict[str, float]]:
    """The DataModule prepared and set up twice in `cache`: cold (tokenizer trained, splits
    tokenised), then from the cache. Returns the second one and the timings (s)."""
    kw = {
        "name": "bench",
        "dir": args.dir,
        "src_lang": args.src,
        "tgt_lang": args.tgt,
        "splits": {"train": "train", "valid": "valid", "test": args.test_split},
        "cache_dir": cache,
        "tokenizer": {"vocab_size": args.vocab_size},
        "max_tokens": args.max_tokens,
        "num_proc": args.num_proc,
        "seed": args.seed,
    }
    t0 = time.perf_counter()
    first = TranslationDataModule(**kw)
    first.prepare_data()
    first.setup("fit")
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    dm = TranslationDataModule(**kw)
    dm.prepare_data()
    dm.setup("fit")
    warm = time.perf_counter() - t0
    return dm, {"tok": first.timings["tokenizer_train_s"], "cold": cold, "warm": warm}


def batching_rows(
    dm: TranslationDataModule, max_tokens: int, seed: int
) -> list[tuple[str, dict[str, float]]]:
    """`padding_stats` of the default bucketing and of the alternatives, one row each."""
    ds = dm.datasets["train"]
    src_len, tgt_len = ds.src_lengths(), ds.tgt_lengths()
    common = {"seed": seed, "rank": 0, "world_size": 1}

    def stats(**kw: object) -> dict[str, float]:
        return padding_stats(dm, TokenBudgetBatchSampler(src_len, tgt_len, **kw, **common))

    bucket = stats(max_tokens=max_tokens)
    unsorted = stats(max_tokens=max_tokens, sort=False)
    pooled = stats(max_tokens=max_tokens, bucket_pool=10)
    bs = max(1, round(bucket["sentences"]))
    sentences = stats(max_tokens=None, batch_size=bs, sort=False)
    sentences_sorted = stats(max_tokens=None, batch_size=bs)
    return [
        ("token budget + bucketing (default)", bucket),
        ("token budget + bucketing in pools of 10 batches", pooled),
        ("token budget, no sorting", unsorted),
        (f"{bs} sentences per batch, no sorting", sentences),
        (f"{bs} sentences per batch, sorted", sentences_sorted),
    ]


def epoch_and_ranks(dm: TranslationDataModule, max_tokens: int, seed: int) -> dict[str, float]:
    """Batches and seconds of one train epoch (num_workers=0), and batches per rank at world
    sizes 2 and 4."""
    loader = dm.train_dataloader()
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    out: dict[str, float] = {"batches": n, "epoch_s": time.perf_counter() - t0}
    ds = dm.datasets["train"]
    for w in (2, 4):
        out[f"ddp{w}"] = len(
            TokenBudgetBatchSampler(
                ds.src_lengths(), ds.tgt_lengths(), max_tokens=max_tokens, seed=seed, rank=0,
                world_size=w,
            )
        )  # fmt: skip
    return out


def render(
    args: argparse.Namespace,
    dm: TranslationDataModule,
    times: dict[str, float],
    rows: list[tuple[str, dict[str, float]]],
    epoch: dict[str, float],
) -> str:
    """The markdown report (the tables of a lab notebook page)."""
    c = dm.filter_counts
    lines = [
        "# Data pipeline benchmark",
        "",
        f"Corpus: `{Path(args.dir).name}` {args.src}→{args.tgt}, train {c['total']} pairs "
        f"({c['kept']} after filters), joint unigram {args.vocab_size}, "
        f"max_tokens={args.max_tokens}, seed {args.seed}.",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, num_proc={args.num_proc}.",
        "",
        "| stage | seconds |",
        "|---|---:|",
        f"| sentencepiece training (train split, both sides) | {times['tok']:.2f} |",
        f"| first run: read + train tokenizer + tokenise 3 splits + cache | {times['cold']:.2f} |",
        f"| second run (tokenizer and token ids from cache) | {times['warm']:.2f} |",
        f"| iterate one train epoch ({epoch['batches']} batches, num_workers=0) | "
        f"{epoch['epoch_s']:.2f} |",
        "",
        "Padding fraction = padded positions / all positions of the `src` and `tgt_out` "
        "tensors of one epoch (collated for real).",
        "",
        "| batching | batches/epoch | mean sentences | padding | largest B×max(S,T) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['batches']} | {r['sentences']:.1f} | {100 * r['padding']:.1f} % "
            f"| {r['max_cost']} |"
        )
    lines += [
        "",
        f"Under DDP every rank gets the same number of batches: {epoch['ddp2']} per rank at "
        f"world size 2, {epoch['ddp4']} at world size 4.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="litmt-bench-data-") as cache:
        try:
            dm, times = prepare_twice(args, cache)
        except LitmtError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        rows = batching_rows(dm, args.max_tokens, args.seed)
        epoch = epoch_and_ranks(dm, args.max_tokens, args.seed)
    report = render(args, dm, times, rows, epoch)
    print(report)
    if args.out != "-":
        Path(args.out).write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
