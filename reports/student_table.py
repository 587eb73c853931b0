"""The distilled-student table (docs/notebook/2026-12-03-distilled-students.md): each model's int8
CTranslate2 export decoded on a test set by the ct2 engine (int8, the same threads for all),
greedy and beam 5, with BLEU, chrF, sentences/s and size on disk, then the issue's goals.

    python -m reports.student_table \\
        --model teacher=runs/recipe/checkpoints/best.ckpt \\
        --model student-ref=runs/kd/student-ref/checkpoints/best.ckpt \\
        --model student-kd=runs/kd/exports/student-int8 \\
        --data-dir ../shared/data/multi30k --teacher teacher --student student-kd \\
        --reference-student student-ref --json table.json

A ``--model`` path is a litmt checkpoint (exported in int8 into ``--exports/NAME-int8`` unless
an export of the same checkpoint is already there) or an int8 CTranslate2 export directory.
Size is the sum of the export's file sizes (``du -b``: model.bin, the sentencepiece model,
the vocabulary, config.json, litmt.json). Sentences/s is the median of ``--reps`` timed runs
after a warm-up on the first 16 sentences. BLEU and chrF are sacreBLEU's defaults.
Every other test set of the data directory (``test*.{src}`` with its ``.{tgt}``) is scored
too (the held-out check); Multi30k as shipped here has test2016 only.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchmark_engines import ensure_export
from benchmarks.common import (
    add_test_set_args,
    median_timed,
    parallel_lines,
    write_result_record,
)
from litmt.cli.script.exits import cli_errors
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.deploy.export.ct2 import is_export_dir, read_metadata
from litmt.errors import LitmtError
from litmt.metrics import corpus_scores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--model", action="append", required=True, metavar="NAME=PATH",
        help="a row: its name and a checkpoint or int8 ct2 export (repeat, in table order)",
    )  # fmt: skip
    add_test_set_args(p, "the table's test split")
    p.add_argument("--exports", default="exports/student-table", help="where exports go")
    p.add_argument("--beam", type=int, nargs="+", default=[1, 5], help="beam sizes (1: greedy)")
    p.add_argument("--teacher", default=None, help="the teacher's row name (for the goals)")
    p.add_argument("--student", default=None, help="the distilled student's row name")
    p.add_argument("--reference-student", default=None, help="the reference-trained student")
    p.add_argument("--born-again", default=None, help="the student of the teacher's own shape")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--record", default=None, help="also write docs/results/records/<ID>.json")
    return p.parse_args(argv)


def int8_export(name: str, path: Path, exports: Path) -> Path:
    """The int8 ct2 export of row `name`: `path` itself when it is one, else exported."""
    if is_export_dir(path):
        quantization = read_metadata(path).get("quantization")
        if quantization != "int8":
            raise LitmtError(
                f"{path} is not an int8 export (quantization={quantization}); the table "
                "compares int8 exports"
            )
        return path
    if not path.is_file():
        raise LitmtError(f"--model {name}={path}: no checkpoint or ct2 export there")
    return ensure_export(path, exports / name, "int8")


def parameters(export: Path) -> int:
    """The model's parameter count, from the export's ``model_config`` (litmt.json): the
    model built on the meta device (no memory), its parameters counted."""
    from litmt.models import Seq2SeqTransformer, TransformerConfig

    config = TransformerConfig.from_dict(read_metadata(export)["model_config"])
    with torch.device("meta"):
        return Seq2SeqTransformer(config).num_parameters()


def size_on_disk(directory: Path) -> int:
    """Bytes of the files under `directory` (what ``du -b`` sums for files)."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def test_splits(data_dir: Path, split: str, src: str, tgt: str) -> list[str]:
    """`split` first, then every other ``test*`` split with both language files."""
    stems = (p.name.removesuffix(f".{src}") for p in data_dir.glob(f"test*.{src}"))
    others = sorted(stem for stem in stems if (data_dir / f"{stem}.{tgt}").is_file())
    return [split] + [s for s in others if s != split]


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One dict per (model, split, beam): BLEU, chrF, sentences/s, seconds, bytes."""
    data_dir, rows = Path(args.data_dir), []
    splits = test_splits(data_dir, args.split, args.src_lang, args.tgt_lang)
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path:
            raise LitmtError(f"--model {spec!r}: expected NAME=PATH")
        export = int8_export(name, Path(path), Path(args.exports))
        translator = CT2Translator(export, device="cpu", compute_type="int8", threads=args.threads)
        size, n_parameters = size_on_disk(export), parameters(export)  # once per model
        for split in splits:
            src, ref = parallel_lines(
                str(data_dir / f"{split}.{args.src_lang}"),
                str(data_dir / f"{split}.{args.tgt_lang}"),
            )
            for beam in args.beam:
                translator.translate(src[:16], beam_size=beam)  # warm-up
                reps = args.reps if split == args.split else 1
                hyps, seconds = median_timed(
                    lambda t=translator, s=src, b=beam: t.translate(s, beam_size=b), reps
                )
                scores = corpus_scores(hyps, ref, metrics=("bleu", "chrf"))
                rows.append(
                    {
                        "model": name, "export": str(export), "split": split, "beam": beam,
                        "bleu": scores["bleu"].score, "chrf": scores["chrf"].score,
                        "seconds": seconds, "sentences_per_s": len(src) / seconds,
                        "bytes": size, "sentences": len(src), "parameters": n_parameters,
                    }
                )  # fmt: skip
                print(f"{name} {split} beam {beam}: BLEU {rows[-1]['bleu']:.2f}", file=sys.stderr)
    return rows


def goals(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The goals as printed lines (those whose rows are named): the student's greedy within
    1.0 BLEU of the teacher's beam 5 at >= 3x its sentences/s with fewer parameters; >= +1.0
    over the reference-trained student of its shape (each beam); the born-again student's
    beam 5 >= 0.5 BLEU above the teacher's."""
    if not args.teacher:
        return []

    def row(model: str, beam: int) -> dict[str, Any]:
        return next(
            r
            for r in rows
            if r["model"] == model and r["split"] == args.split and r["beam"] == beam
        )

    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    teacher = row(args.teacher, 5)
    lines = []
    if args.student:
        student = row(args.student, 1)
        gap = student["bleu"] - teacher["bleu"]
        speed = student["sentences_per_s"] / teacher["sentences_per_s"]
        fewer = student["parameters"] < teacher["parameters"]
        lines.append(
            f"- student greedy vs teacher beam 5: {gap:+.2f} BLEU (goal >= -1.00: "
            f"{verdict(gap >= -1.0)}); {speed:.2f}x the sentences/s (goal >= 3x: "
            f"{verdict(speed >= 3.0)}); {student['parameters']:,} parameters against "
            f"{teacher['parameters']:,} (goal: fewer: {verdict(fewer)})"
        )
        lines.append(
            f"- int8 size (reported, not a goal): {student['bytes']:,} bytes, "
            f"{100 * student['bytes'] / teacher['bytes']:.1f} % of the teacher's"
        )
    if args.student and args.reference_student:
        for beam in args.beam:
            diff = row(args.student, beam)["bleu"] - row(args.reference_student, beam)["bleu"]
            lines.append(
                f"- distilled vs reference-trained student, beam {beam}: {diff:+.2f} BLEU "
                f"(goal >= +1.00: {verdict(diff >= 1.0)})"
            )
    if args.born_again:
        diff = row(args.born_again, 5)["bleu"] - teacher["bleu"]
        lines.append(
            f"- born-again student vs teacher, beam 5: {diff:+.2f} BLEU (goal >= +0.50: "
            f"{verdict(diff >= 0.5)})"
        )
    return lines


def record_values(rows: list[dict[str, Any]], split: str) -> tuple[dict, dict]:
    """The table's rows of `split` as a result record's values and units."""
    values: dict[str, float] = {}
    units: dict[str, str] = {}
    for r in rows:
        if r["split"] != split:
            continue
        key = f"{r['model']}_{'greedy' if r['beam'] == 1 else 'beam' + str(r['beam'])}"
        for name, unit in (("bleu", "BLEU"), ("chrf", "chrF"), ("sentences_per_s", "sentences/s")):
            values[f"{key}_{name}"], units[f"{key}_{name}"] = round(r[name], 2), unit
        values[f"{r['model']}_bytes"], units[f"{r['model']}_bytes"] = r["bytes"], "bytes"
        values[f"{r['model']}_parameters"] = r["parameters"]
        units[f"{r['model']}_parameters"] = "parameters"
    return values, units


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        rows = measure(args)
    print(
        f"ct2 int8, {args.threads} threads, median of {args.reps} run(s) on {args.split}; "
        f"{platform.processor() or platform.machine()}\n"
    )
    print("| model | test set | beam | BLEU | chrF | sentences/s | size (bytes) | parameters |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['split']} | {r['beam']} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
            f"{r['sentences_per_s']:.1f} | {r['bytes']:,} | {r['parameters']:,} |"
        )
    lines = goals(rows, args)
    print("\n" + "\n".join(lines) if lines else "")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "rows": rows, "goals": lines}, indent=2)
        )
    if args.record:
        values, units = record_values(rows, args.split)
        path = write_result_record(
            args.record,
            f"Distilled students against their teacher (ct2 int8, {args.threads} threads)",
            "reports.student_table",
            sys.argv[1:] if argv is None else argv,
            values,
            units,
            notes=f"{args.split}; BLEU and chrF are sacreBLEU's defaults; sentences/s the "
            f"median of {args.reps} runs; " + " ".join(lines),
        )
        print(f"result record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
