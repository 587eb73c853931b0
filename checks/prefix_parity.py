"""Prefix parity: the torch engine against the ct2 engine with a target prefix, n-best lists.

    python -m checks.prefix_parity --ckpt model.ckpt [--ct2 EXPORT_DIR] [--limit 500]

On the first `--limit` lines of test2016 (``../shared/data/multi30k``), three kinds of prefix
taken from the reference: its first 2 words, its first half (words), the whole reference.
Both engines decode every line with the same options (beam 5, n_best 3, length penalty 1,
the checkpoint's output budget) and their n-best lists (token ids) are compared. They must be
identical wherever the torch search decides with a margin over `NEAR_TIE`, with at most
`max_excused` near-ties per kind (the parity rule of `checks.decode_margins`). Every difference is printed with its category:

- ``near-tie``: at the first rank where the lists differ, the two hypotheses part where the
  torch model's log-probabilities of their two tokens differ by at most `NEAR_TIE`
  (`parting_gaps`); another computation may decide it otherwise.
- ``ranking tie``: there, the two hypotheses' scores are within `NEAR_TIE`: the same search,
  sorted differently at the last bits.
- ``budget``: a differing hypothesis ends at the output budget: at the budget's last step
  CTranslate2 finishes its K best candidates, litmt its K best non-eos ones plus the forced
  eos (`litmt.deploy.engines.ct2`, what remains different).
- ``unexplained``: none of these. The script then exits with status 1, as it does when a
  kind's near-ties and ranking ties are more than `max_excused` of its lines.

Prints a markdown table per kind and every difference; --json writes the numbers. The ct2
engine reads --ct2 (an export of --ckpt: ``python scripts/export.py ckpt_path=CKPT out=DIR``),
or an export written into --exports (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchmark_engines import ensure_export
from benchmarks.common import MULTI30K, checkpoint_run, export_of
from checks.decode_margins import NEAR_TIE, exit_status, parting_gaps
from litmt.cli.script.exits import cli_errors
from litmt.decoding.search.rules import Hypothesis, output_budgets
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.deploy.export.ct2 import read_metadata

KINDS = ("2 words", "half", "whole")
CATEGORIES = ("near-tie", "ranking tie", "budget", "unexplained")


def prefix_of(reference: str, kind: str) -> str:
    """The prefix of `kind` (one of `KINDS`) taken from `reference`'s whitespace words."""
    words = reference.split()
    if kind == "2 words":
        return " ".join(words[:2])
    if kind == "half":
        return " ".join(words[: max(1, len(words) // 2)])
    return reference


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint")
    p.add_argument("--ct2", default=None, help="a CTranslate2 export of --ckpt (else exported)")
    p.add_argument("--exports", default=None, help="where to export --ckpt when --ct2 is unset")
    p.add_argument("--src", default=str(MULTI30K / "test2016.en"), help="source test file")
    p.add_argument("--ref", default=str(MULTI30K / "test2016.de"), help="references of --src")
    p.add_argument("--limit", type=int, default=500, help="the first N lines (0 = all)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="prefixes")
    p.add_argument("--beam", type=int, default=5, help="beam size")
    p.add_argument("--n-best", type=int, default=3, help="hypotheses compared per line")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each engine")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p.parse_args(argv)


def scored_texts(tr: Translator, hyps: list[Hypothesis]) -> list[tuple[str, float]]:
    """(text, score) of each hypothesis of one line."""
    texts = tr.tokenizer.decode_tgt([h.tokens for h in hyps])
    return [(text, h.score) for text, h in zip(texts, hyps, strict=True)]


def categorise(
    tr: Translator, src: list[int], prefix: list[int], ref, got, budget: int, options: dict
) -> tuple[str, float]:
    """The category of one differing line (module docstring) and the torch model's gap of the
    two tokens where the lists part (`parting_gaps`, at the first rank where they differ)."""
    j = next(
        (r for r, (a, b) in enumerate(zip(ref, got, strict=False)) if a.tokens != b.tokens), None
    )
    step = ranking = float("inf")
    if j is not None:
        step, ranking = parting_gaps(
            tr, src, ref[j].tokens, got[j].tokens, options["length_penalty"]
        )
    margin = step
    if step <= NEAR_TIE:
        return "near-tie", margin
    if ranking <= NEAR_TIE:
        return "ranking tie", margin
    a, b = {tuple(h.tokens) for h in ref}, {tuple(h.tokens) for h in got}
    if any(len(t) == budget for t in a ^ b):
        return "budget", margin
    return "unexplained", margin


def compare_kind(
    tr: Translator, ct2: CT2Translator, src: list[str], ref: list[str], kind: str, args
) -> dict[str, Any]:
    """Both engines on every line with prefixes of `kind`: counts, seconds, differences."""
    ids = [tr.prepare(s) for s in src]
    prefixes, _ = tr.encode_steering(len(src), [prefix_of(r, kind) for r in ref])
    config = tr.default_config  # the checkpoint's budget, passed to both engines
    options = dict(
        beam_size=args.beam,
        n_best=args.n_best,
        length_penalty=args.alpha,
        max_len_a=config.max_len_a,
        max_len_b=config.max_len_b,
        min_len=config.min_len,
    )
    found: dict[str, list[list[Hypothesis]]] = {}
    seconds: dict[str, float] = {}
    for name, engine in (("torch", tr), ("ct2", ct2)):
        engine.search_ids(ids[:8], prefixes=prefixes[:8], **options)  # warm-up
        start = time.perf_counter()
        found[name] = engine.search_ids(ids, prefixes=prefixes, **options)
        seconds[name] = time.perf_counter() - start
    budgets = output_budgets(
        [len(s) for s in ids],
        config.max_len_a,
        config.max_len_b,
        tr.max_source_tokens,
        [len(p) for p in prefixes],
    ).tolist()
    differences = []
    for i, (a, b) in enumerate(zip(found["torch"], found["ct2"], strict=True)):
        if [h.tokens for h in a] == [h.tokens for h in b]:
            continue
        category, margin = categorise(tr, ids[i], prefixes[i], a, b, budgets[i], options)
        differences.append(
            {
                "line": i + 1,
                "category": category,
                "margin": margin,
                "prefix": prefix_of(ref[i], kind),
                "torch": scored_texts(tr, a),
                "ct2": scored_texts(tr, b),
            }
        )
    return {
        "kind": kind,
        "lines": len(src),
        "identical_lists": len(src) - len(differences),
        "identical_1best": sum(
            a[0].tokens == b[0].tokens for a, b in zip(found["torch"], found["ct2"], strict=True)
        ),
        "seconds": seconds,
        "differences": differences,
    }


def report(results: list[dict[str, Any]], args, n: int) -> None:
    """Print the table of every kind, then every difference with its category."""
    print(
        f"{n} lines of {Path(args.src).name}, beam {args.beam}, n_best {args.n_best}, length "
        f"penalty {args.alpha}, {args.threads} thread(s), NEAR_TIE {NEAR_TIE}; torch "
        f"{torch.__version__}, {platform.processor() or platform.machine()}\n"
    )
    print("| prefix | identical n-best lists | identical 1-best | near-tie | ranking tie | "
          "budget | unexplained | seconds torch / ct2 |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        count = {c: sum(d["category"] == c for d in r["differences"]) for c in CATEGORIES}
        print(
            f"| {r['kind']} | {r['identical_lists']} / {r['lines']} | {r['identical_1best']} | "
            f"{count['near-tie']} | {count['ranking tie']} | {count['budget']} | "
            f"{count['unexplained']} | {r['seconds']['torch']:.1f} / {r['seconds']['ct2']:.1f} |"
        )
    for r in results:
        for d in r["differences"]:
            print(
                f"\n  [{r['kind']}] line {d['line']}: {d['category']} (gap where they part "
                f"{d['margin']:.2e}), prefix {d['prefix']!r}"
            )
            for name in ("torch", "ct2"):
                hyps = ", ".join(f"{text!r} ({score:.4f})" for text, score in d[name])
                print(f"    {name:5}: {hyps}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        src, ref, ckpt, tr = checkpoint_run(args)
        with tempfile.TemporaryDirectory() as tmp:
            export = export_of(
                ckpt, args.ct2, "--ct2", lambda e: read_metadata(e)["checkpoint_sha256"],
                lambda: ensure_export(ckpt, Path(args.exports or tmp), "none"),
            )  # fmt: skip
            ct2 = CT2Translator(export, device="cpu", threads=args.threads)
            results = [compare_kind(tr, ct2, src, ref, kind, args) for kind in args.kinds]
    report(results, args, len(src))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "kinds": results}, indent=2))
    return exit_status(results, "kind")


if __name__ == "__main__":
    sys.exit(main())
