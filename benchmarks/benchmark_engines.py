"""BLEU and speed of the decoding engines: torch, CTranslate2 float32, CTranslate2 int8.

Every engine translates the same test file with the same options (beam 5, the same output
budget and length penalty) on the same number of threads; sentences/s is the median of
`--reps` timed runs after one warm-up run on the first sentences. BLEU is sacreBLEU's.
Prints a markdown table (and, with --json, writes the numbers).

    python -m benchmarks.benchmark_engines --ckpt model.ckpt \\
        --src ../shared/data/multi30k/test2016.en --ref ../shared/data/multi30k/test2016.de
    python -m benchmarks.benchmark_engines --ckpt model.ckpt --src S --ref R --smoke   # seconds

The two CTranslate2 exports are written into --exports (default: a temporary directory),
or reused from there when present.
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
from litmt.cli.exits import cli_errors
from litmt.decoding.translator import Translator
from litmt.deploy.ct2_engine import CT2Translator
from litmt.deploy.ct2_export import export_model, file_sha256, is_export_dir, read_metadata
from litmt.metrics import corpus_bleu


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint")
    p.add_argument("--src", required=True, help="source test file, one sentence per line")
    p.add_argument("--ref", required=True, help="reference file, aligned with --src")
    p.add_argument("--exports", default=None, help="where the ct2 exports are written/reused")
    p.add_argument("--beam", type=int, default=5, help="beam size")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every engine")
    p.add_argument("--reps", type=int, default=3, help="timed runs per engine (median)")
    p.add_argument("--limit", type=int, default=0, help="use the first N sentences (0 = all)")
    p.add_argument("--max-tokens", type=int, default=4096, help="padded source tokens per batch")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--smoke", action="store_true", help="16 sentences, beam 2, one run: a check")
    args = p.parse_args(argv)
    if args.smoke:
        args.limit, args.beam, args.reps = 16, 2, 1
    return args


def ensure_export(ckpt: Path, directory: Path, quantization: str) -> Path:
    """The export of `ckpt` with `quantization` in `directory`, written when missing/stale."""
    out = directory / quantization
    if is_export_dir(out) and read_metadata(out)["checkpoint_sha256"] == file_sha256(ckpt):
        return out
    return export_model(ckpt, out, quantization=quantization, force=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        src, ref = parallel_lines(args.src, args.ref, args.limit)
        torch.set_num_threads(args.threads)
        ckpt = Path(args.ckpt)
        with tempfile.TemporaryDirectory() as tmp:
            exports = Path(args.exports) if args.exports else Path(tmp)
            engines: dict[str, Callable[[], Translator]] = {
                "torch": lambda: Translator.from_checkpoint(ckpt, device="cpu"),
                "ct2 float32": lambda: CT2Translator(
                    ensure_export(ckpt, exports, "none"), device="cpu", threads=args.threads
                ),
                "ct2 int8": lambda: CT2Translator(
                    ensure_export(ckpt, exports, "int8"), device="cpu", threads=args.threads
                ),
            }
            options = dict(beam_size=args.beam, max_tokens=args.max_tokens)
            rows = []
            for name, load in engines.items():
                translator = load()
                translator.translate(src[:16], **options)  # warm-up
                hyps, seconds = median_timed(
                    lambda t=translator: t.translate(src, **options), args.reps
                )
                rows.append(
                    {
                        "engine": name,
                        "bleu": corpus_bleu(hyps, ref),
                        "seconds": seconds,
                        "sentences_per_s": len(src) / seconds,
                    }
                )
    base = rows[0]
    print(
        f"{len(src)} sentences of {Path(args.src).name}, beam {args.beam}, {args.threads} "
        f"threads, median of {args.reps} run(s); torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    print("| engine | BLEU | Δ BLEU vs torch | sentences/s | speed-up vs torch |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['bleu']:.2f} | {r['bleu'] - base['bleu']:+.2f} | "
            f"{r['sentences_per_s']:.1f} | {r['sentences_per_s'] / base['sentences_per_s']:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
