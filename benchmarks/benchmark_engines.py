"""BLEU and speed of the decoding engines: torch, CTranslate2 float32 and int8, onnxruntime
float32 and int8 (`engine=onnx`), at beam 5 and greedy, in one table.

Every engine translates the same test file with the same options (each beam size of
--beam, the same output budget and length penalty) on the same number of threads;
sentences/s is the median of `--reps` timed runs after one warm-up run on the first
sentences. BLEU is sacreBLEU's. Prints a markdown table (and, with --json, writes the numbers).

    python -m benchmarks.benchmark_engines --ckpt model.ckpt \\
        --src ../shared/data/multi30k/test2016.en --ref ../shared/data/multi30k/test2016.de
    python -m benchmarks.benchmark_engines --ckpt model.ckpt --src S --ref R --smoke   # seconds

--ckpt may be an imported Marian (``scripts/import_hf.py`` writes a .ckpt). The CTranslate2
and ONNX exports are written into --exports (default: a temporary directory), or reused from
there when present (``none``/``int8``: ct2; ``onnx-none``/``onnx-int8``: onnx).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import median_timed, parallel_lines
from litmt.cli.script.exits import cli_errors
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.deploy.engines.onnx import OnnxTranslator
from litmt.deploy.export.base import file_sha256
from litmt.deploy.export.ct2 import export_model, is_export_dir, read_metadata
from litmt.deploy.export.onnx import export_onnx, is_current_onnx_dir, read_onnx_config
from litmt.metrics import corpus_bleu

ENGINES = ("torch", "ct2 float32", "ct2 int8", "onnx float32", "onnx int8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint")
    p.add_argument("--src", required=True, help="source test file, one sentence per line")
    p.add_argument("--ref", required=True, help="reference file, aligned with --src")
    p.add_argument("--exports", default=None, help="where the ct2 exports are written/reused")
    p.add_argument(
        "--beam", type=int, nargs="+", default=None, help="beam sizes (1: greedy; default 5 1)"
    )
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES, help="rows")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every engine")
    p.add_argument("--reps", type=int, default=3, help="timed runs per engine (median)")
    p.add_argument("--limit", type=int, default=0, help="use the first N sentences (0 = all)")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded source tokens per batch")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument(
        "--smoke", action="store_true", help="16 sentences, one run (beams 2 1): a check"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.limit, args.reps, args.beam = 16, 1, args.beam or [2, 1]
    args.beam = args.beam or [5, 1]
    return args


def ensure_export(ckpt: Path, directory: Path, quantization: str) -> Path:
    """The export of `ckpt` with `quantization` in `directory`, written when missing/stale."""
    out = directory / quantization
    if is_export_dir(out) and read_metadata(out)["checkpoint_sha256"] == file_sha256(ckpt):
        return out
    return export_model(ckpt, out, quantization=quantization, force=True)


def ensure_onnx_export(ckpt: Path, directory: Path, quantization: str) -> Path:
    """The ONNX export of `ckpt` with `quantization` in `directory`, written when missing/stale."""
    out = directory / f"onnx-{quantization}"
    current = is_current_onnx_dir(out)  # another format version is exported again
    if current and read_onnx_config(out)["checkpoint_sha256"] == file_sha256(ckpt):
        return out
    return export_onnx(ckpt, out, quantization=quantization, force=True)


def loaders(ckpt: Path, exports: Path, threads: int) -> dict[str, Callable[[], Translator]]:
    """How to load each engine of `ENGINES` (exports written on first use)."""
    return {
        "torch": lambda: Translator.from_checkpoint(ckpt, device="cpu"),
        "ct2 float32": lambda: CT2Translator(
            ensure_export(ckpt, exports, "none"), device="cpu", threads=threads
        ),
        "ct2 int8": lambda: CT2Translator(
            ensure_export(ckpt, exports, "int8"), device="cpu", threads=threads
        ),
        "onnx float32": lambda: OnnxTranslator(
            ensure_onnx_export(ckpt, exports, "none"), threads=threads
        ),
        "onnx int8": lambda: OnnxTranslator(
            ensure_onnx_export(ckpt, exports, "int8"), threads=threads
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        src, ref = parallel_lines(args.src, args.ref, args.limit)
        torch.set_num_threads(args.threads)
        ckpt = Path(args.ckpt)
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            exports = Path(args.exports) if args.exports else Path(tmp)
            load = loaders(ckpt, exports, args.threads)
            for name in args.engines:
                translator = load[name]()
                for beam in args.beam:
                    options = dict(beam_size=beam, max_tokens=args.max_tokens)
                    translator.translate(src[:16], **options)  # warm-up
                    hyps, seconds = median_timed(
                        lambda t=translator, o=options: t.translate(src, **o), args.reps
                    )
                    rows.append(
                        {
                            "engine": name,
                            "beam": beam,
                            "bleu": corpus_bleu(hyps, ref),
                            "seconds": seconds,
                            "sentences_per_s": len(src) / seconds,
                        }
                    )
    print(
        f"{len(src)} sentences of {Path(args.src).name}, {args.threads} threads, median of "
        f"{args.reps} run(s); torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


def print_table(rows: list[dict]) -> None:
    """One markdown table, grouped by beam; Δ BLEU and speed-up against the first engine
    (torch by default) at the same beam."""
    print(f"| engine | beam | BLEU | Δ BLEU vs {rows[0]['engine']} | sentences/s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for beam in dict.fromkeys(r["beam"] for r in rows):
        group = [r for r in rows if r["beam"] == beam]
        base = group[0]
        for r in group:
            print(
                f"| {r['engine']} | {beam} | {r['bleu']:.2f} | {r['bleu'] - base['bleu']:+.2f} | "
                f"{r['sentences_per_s']:.1f} | "
                f"{r['sentences_per_s'] / base['sentences_per_s']:.2f}x |"
            )


if __name__ == "__main__":
    sys.exit(main())
