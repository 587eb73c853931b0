"""ONNX parity: the torch engine against the onnx engine (`engine=onnx`), greedy and beam.

    python -m checks.onnx_parity --ckpt model.ckpt [--onnx EXPORT_DIR] [--limit 500]
    python -m checks.onnx_parity --ckpt marian.ckpt   # an imported Marian (import_hf.py)

On the first `--limit` lines of test2016 (``../shared/data/multi30k``), both engines decode
every line with the same options (each beam size of --beam, 1 = greedy; length penalty
--alpha; the checkpoint's output budget) and their 1-best outputs (token ids) are compared.
The onnx engine runs litmt's own search over the exported graphs, so they must be identical
wherever the torch search decides with a margin over `NEAR_TIE`, and near-ties may excuse at
most `max_excused` lines per beam size (the parity rule of `checks.decode_margins`).
Every difference is printed with its category and margin:

- ``near-tie``: where the two outputs part, the torch model's log-probabilities of their two
  tokens differ by at most `NEAR_TIE` (`parting_gaps`, from its own log-probabilities); the
  graphs' float32 rounding may decide otherwise.
- ``ranking tie``: the two outputs score within `NEAR_TIE` of each other under the torch
  model (forced decoding, GNMT score): the same search, ranked differently at the last bits.
- ``int8``: neither, and the export is int8 (`--onnx` of ``quantization=int8``): its weights
  differ from the checkpoint's, so its decisions may too (reported, not a failure).
- ``unexplained``: none of these. The script then exits with status 1, as it does when the
  near-ties and ranking ties of a beam size are more than `max_excused` of its lines.

For identical outputs it also reports the largest score difference (the graphs' rounding).
Prints a markdown table per beam size and every difference; --json writes the numbers. The
onnx engine reads --onnx (an export of --ckpt: ``scripts/export.py format=onnx``), or an
export written into --exports (default: a temporary directory).
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

from benchmarks.benchmark_engines import ensure_onnx_export
from benchmarks.common import MULTI30K, checkpoint_run, export_of
from checks.decode_margins import NEAR_TIE, exit_status, parting_gaps
from litmt.cli.script.exits import cli_errors
from litmt.decoding.search.rules import Hypothesis
from litmt.decoding.translator import Translator
from litmt.deploy.engines.onnx import OnnxTranslator
from litmt.deploy.export.onnx import read_onnx_config

CATEGORIES = ("near-tie", "ranking tie", "int8", "unexplained")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint (or an imported Marian)")
    p.add_argument("--onnx", default=None, help="an ONNX export of --ckpt (else exported)")
    p.add_argument("--exports", default=None, help="where to export --ckpt when --onnx is unset")
    p.add_argument("--src", default=str(MULTI30K / "test2016.en"), help="source test file")
    p.add_argument("--ref", default=str(MULTI30K / "test2016.de"), help="references of --src")
    p.add_argument("--limit", type=int, default=500, help="the first N lines (0 = all)")
    p.add_argument("--beam", type=int, nargs="+", default=[1, 5], help="beam sizes (1: greedy)")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each engine")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p.parse_args(argv)


def scored_text(tr: Translator, hyp: Hypothesis) -> tuple[str, float]:
    return tr.tokenizer.decode_tgt([hyp.tokens])[0], hyp.score


def categorise(
    tr: Translator, src: list[int], a: Hypothesis, b: Hypothesis, options: dict, int8: bool
) -> tuple[str, float]:
    """The category of one differing line (module docstring) and the torch model's gap of
    the two tokens where the outputs part (`parting_gaps`)."""
    step, ranking = parting_gaps(tr, src, a.tokens, b.tokens, options["length_penalty"])
    if step <= NEAR_TIE:
        return "near-tie", step
    if ranking <= NEAR_TIE:
        return "ranking tie", step
    return ("int8" if int8 else "unexplained"), step


def compare_beam(
    tr: Translator, onnx: OnnxTranslator, ids: list[list[int]], beam: int, args
) -> dict[str, Any]:
    """Both engines on every line at `beam`: counts, seconds, score drift, differences."""
    config = tr.default_config  # the checkpoint's budget, passed to both engines
    options = dict(
        beam_size=beam,
        length_penalty=args.alpha,
        max_len_a=config.max_len_a,
        max_len_b=config.max_len_b,
        min_len=config.min_len,
    )
    found: dict[str, list[list[Hypothesis]]] = {}
    seconds: dict[str, float] = {}
    for name, engine in (("torch", tr), ("onnx", onnx)):
        engine.search_ids(ids[:8], **options)  # warm-up
        start = time.perf_counter()
        found[name] = engine.search_ids(ids, **options)
        seconds[name] = time.perf_counter() - start
    differences, drift = [], 0.0
    for i, (a, b) in enumerate(zip(found["torch"], found["onnx"], strict=True)):
        if not a or not b:  # an empty source: no hypothesis on either side
            continue
        if a[0].tokens == b[0].tokens:
            drift = max(drift, abs(a[0].score - b[0].score))
            continue
        int8 = onnx.meta["quantization"] == "int8"
        category, margin = categorise(tr, ids[i], a[0], b[0], options, int8)
        differences.append(
            {
                "line": i + 1,
                "category": category,
                "margin": margin,
                "torch": scored_text(tr, a[0]),
                "onnx": scored_text(tr, b[0]),
            }
        )
    return {
        "beam": beam,
        "lines": len(ids),
        "identical": len(ids) - len(differences),
        "max_score_diff_identical": drift,
        "seconds": seconds,
        "differences": differences,
    }


def report(results: list[dict[str, Any]], args, n: int, export: Path) -> None:
    """Print the table of every beam size, then every difference with its category."""
    print(
        f"{n} lines of {Path(args.src).name}, length penalty {args.alpha}, {args.threads} "
        f"thread(s), NEAR_TIE {NEAR_TIE}, export {export.name} "
        f"({read_onnx_config(export)['quantization']}); torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    print("| beam | identical 1-best | near-tie | ranking tie | int8 | unexplained | "
          "max score diff (identical) | seconds torch / onnx |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        count = {c: sum(d["category"] == c for d in r["differences"]) for c in CATEGORIES}
        print(
            f"| {r['beam']} | {r['identical']} / {r['lines']} | {count['near-tie']} | "
            f"{count['ranking tie']} | {count['int8']} | {count['unexplained']} | "
            f"{r['max_score_diff_identical']:.1e} | "
            f"{r['seconds']['torch']:.1f} / {r['seconds']['onnx']:.1f} |"
        )
    for r in results:
        for d in r["differences"]:
            print(
                f"\n  [beam {r['beam']}] line {d['line']}: {d['category']} (gap where "
                f"they part {d['margin']:.2e})"
            )
            for name in ("torch", "onnx"):
                text, score = d[name]
                print(f"    {name:5}: {text!r} ({score:.4f})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        src, _, ckpt, tr = checkpoint_run(args)
        with tempfile.TemporaryDirectory() as tmp:
            export = export_of(
                ckpt, args.onnx, "--onnx", lambda e: read_onnx_config(e)["checkpoint_sha256"],
                lambda: ensure_onnx_export(ckpt, Path(args.exports or tmp), "none"),
            )  # fmt: skip
            onnx = OnnxTranslator(export, threads=args.threads)
            ids = [tr.prepare(s) for s in src]
            results = [compare_beam(tr, onnx, ids, beam, args) for beam in args.beam]
            report(results, args, len(src), export)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "beams": results}, indent=2))
    return exit_status(results, "beam")


if __name__ == "__main__":
    sys.exit(main())
