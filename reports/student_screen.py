"""Student shapes screened by speed before any is trained: each shape's int8 CTranslate2 greedy
decode against the trained teacher's beam 5 on a test set (ct2 engine, int8, the same threads),
so that shapes too slow for the goal (--goal, 3x the teacher's beam-5 sentences/s) are dropped
before their training runs.

    python -m reports.student_screen --teacher TEACHER.ckpt --data-dir ../shared/data/multi30k \\
        --shape d_model=128,d_ff=512,n_encoder_layers=6,n_decoder_layers=2 \\
        --shape d_model=160,d_ff=640,n_encoder_layers=6,n_decoder_layers=1,vocab_size=3000 \\
        --corpus data/multi30k_kd

A shape is ``key=value`` pairs of `litmt.models.TransformerConfig` (the others are the
teacher's) and optionally ``vocab_size=N``: a tokenizer of N pieces trained on ``--corpus``
(``train.{src,tgt}``, e.g. the distilled corpus, as the student recipe's own), else the
teacher's. Its weights are random (perturbed, as `reports.student_sizes` builds them), so its
own outputs would not end where a trained model's do: it decodes greedily with each sentence's
output length forced to the teacher's beam-5 output length in its own subword tokens
(CTranslate2's minimum = maximum decoding length, one asynchronous call per length). The
teacher's own shape with random weights, decoded the same way, calibrates the method against
the teacher's real greedy decode: a shape's estimated time is its forced time plus the
teacher's greedy time minus its shape's forced time: what the forced decode leaves out is
mostly the engine's own work per sentence, about the same for every shape, so it is added,
not scaled. Each forced run encodes and decodes text as the engine does. Times are the
median of --reps timed runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.benchmark_engines import ensure_export
from benchmarks.common import add_test_set_args, median_timed, parallel_lines
from litmt.checkpoint.io import META_KEY, load_checkpoint
from litmt.cli.script.exits import cli_errors
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig, train_spm
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.deploy.export.ct2_spec import ct2_vocabulary
from litmt.errors import LitmtError
from reports.student_sizes import random_export

MAX_TOKENS = 4096  # padded source tokens per CTranslate2 batch, as the ct2 engine's default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--teacher", required=True, help="the trained teacher's .ckpt")
    p.add_argument(
        "--shape", action="append", required=True, metavar="KEY=VALUE,...",
        help="a candidate shape: TransformerConfig keys, optionally vocab_size (repeat)",
    )  # fmt: skip
    add_test_set_args(p, "the test split decoded")
    p.add_argument("--corpus", default=None, help="train.{src,tgt} for a shape's vocab_size")
    p.add_argument("--exports", default="exports/student-screen", help="the teacher's export")
    p.add_argument("--goal", type=float, default=3.0, help="x the teacher's beam-5 rate")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    return p.parse_args(argv)


def parse_shape(spec: str) -> dict[str, Any]:
    """``d_model=128,n_decoder_layers=1`` -> {"d_model": 128, "n_decoder_layers": 1}."""
    shape = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LitmtError(f"--shape {spec!r}: expected KEY=VALUE pairs separated by commas")
        shape[key.strip()] = yaml.safe_load(value)
    return shape


def forced_decoder(
    translator: CT2Translator, sources: list[str], lengths: list[int]
) -> tuple[int, Callable[[], list[tuple[int, int]]]]:
    """(sentences decoded, a greedy decode of `sources` whose outputs are forced to `lengths`
    tokens, returning (length asked, length decoded) per sentence); sentences with an empty
    source or output are left out (module docstring). As the ct2 engine's ``translate``, each
    run encodes the sources and decodes the outputs to text."""
    tok = translator.tokenizer
    src_vocab = ct2_vocabulary(tok, "src")
    tgt_ids = {piece: i for i, piece in enumerate(ct2_vocabulary(tok, "tgt"))}
    todo = [(s, n) for s, n in zip(sources, lengths, strict=True) if s.strip() and n]

    def decode() -> list[tuple[int, int]]:
        groups: dict[int, list[list[str]]] = defaultdict(list)
        for text, length in todo:
            groups[length].append([src_vocab[i] for i in translator.prepare(text)])
        pending = [
            (length, translator.ct2.translate_batch(
                batch, beam_size=1, min_decoding_length=length, max_decoding_length=length,
                max_batch_size=MAX_TOKENS, batch_type="tokens", max_input_length=0,
                asynchronous=True,
            ))
            for length, batch in sorted(groups.items())
        ]  # fmt: skip
        found = [(n, f.result().hypotheses[0]) for n, futures in pending for f in futures]
        tok.decode_tgt([[tgt_ids[p] for p in pieces] for _, pieces in found])
        return [(n, len(pieces)) for n, pieces in found]

    return len(todo), decode


def forced_seconds(
    translator: CT2Translator, sources: list[str], lengths: list[int], reps: int
) -> float:
    """Seconds of `forced_decoder`'s decode: the median of `reps` after a warm-up."""
    _, decode = forced_decoder(translator, sources, lengths)
    decode()  # warm-up
    return median_timed(decode, reps)[1]


def shape_tokenizers(
    shapes: list[dict[str, Any]], meta: dict[str, Any], args: argparse.Namespace
) -> dict[int | None, dict[str, Any]]:
    """The tokenizer of each ``vocab_size`` the shapes ask for (None: the teacher's), trained
    jointly on ``--corpus``'s training split."""
    tokenizers: dict[int | None, dict[str, Any]] = {None: meta["tokenizer"]}
    sizes = sorted({s["vocab_size"] for s in shapes if s.get("vocab_size") is not None})
    if sizes and args.corpus is None:
        raise LitmtError("a --shape sets vocab_size: give --corpus DIR (its train.{src,tgt})")
    for size in sizes:
        lines = [
            line
            for lang in (args.src_lang, args.tgt_lang)
            for line in (Path(args.corpus) / f"train.{lang}").read_text("utf-8").splitlines()
            if line.strip()
        ]
        model = train_spm(iter(lines), TokenizerConfig(vocab_size=size))
        tokenizers[size] = Tokenizer(model).to_dict()
    return tokenizers


def screen(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The table's rows: the teacher's beam 5 and greedy, the teacher's shape (calibration),
    then one per shape with its estimate and verdict."""
    data = Path(args.data_dir)
    sources, _ = parallel_lines(
        str(data / f"{args.split}.{args.src_lang}"), str(data / f"{args.split}.{args.tgt_lang}")
    )
    meta = load_checkpoint(args.teacher)[META_KEY]
    shapes = [parse_shape(spec) for spec in args.shape]
    tokenizers = shape_tokenizers(shapes, meta, args)
    export = ensure_export(Path(args.teacher), Path(args.exports) / "teacher", "int8")
    teacher = CT2Translator(export, device="cpu", compute_type="int8", threads=args.threads)
    outputs, rates = {}, {}
    for beam in (5, 1):
        teacher.translate(sources[:16], beam_size=beam)  # warm-up
        outputs[beam], seconds = median_timed(
            lambda b=beam: teacher.translate(sources, beam_size=b), args.reps
        )
        rates[beam] = len(sources) / seconds
    rows = [
        {"model": "teacher", "decode": "beam 5", "rate": rates[5], "x_beam5": 1.0},
        {"model": "teacher", "decode": "greedy", "rate": rates[1], "x_beam5": rates[1] / rates[5]},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        candidates = [("teacher shape", {}), *zip(args.shape, shapes, strict=True)]
        for n, (name, shape) in enumerate(candidates):
            vocab = shape.get("vocab_size")
            tok = Tokenizer.from_dict(tokenizers[vocab])
            model_keys = {k: v for k, v in shape.items() if k != "vocab_size"}
            sizes = {"src_vocab_size": tok.src_vocab_size, "tgt_vocab_size": tok.tgt_vocab_size}
            config = {**meta["model_config"], **model_keys, **sizes}
            where = Path(tmp) / str(n)
            where.mkdir()
            params, out = random_export({**meta, "tokenizer": tokenizers[vocab]}, config, where)
            student = CT2Translator(out, device="cpu", compute_type="int8", threads=args.threads)
            lengths = [len(ids) for ids in tok.encode_tgt(outputs[5])]
            seconds = forced_seconds(student, sources, lengths, args.reps)
            size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
            rows.append({"model": name, "decode": "greedy, random weights, forced lengths",
                         "forced_seconds": seconds, "forced_rate": len(sources) / seconds,
                         "parameters": params, "bytes": size})  # fmt: skip
            print(f"{name}: {len(sources) / seconds:.1f} sentences/s (forced)", file=sys.stderr)
    offset = len(sources) / rates[1] - rows[2]["forced_seconds"]  # what the forced decode misses
    for row in rows[2:]:
        row["rate"] = len(sources) / (row["forced_seconds"] + offset)
        row["x_beam5"] = row["rate"] / rates[5]
        row["passes"] = row["x_beam5"] >= args.goal
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the random models are built on one thread; ct2 has its own
    with cli_errors():
        rows = screen(args)
    print(
        f"ct2 int8, {args.threads} threads, median of {args.reps} run(s) on {args.split}; "
        f"{platform.processor() or platform.machine()}\n"
    )
    print("| model | decode | forced sentences/s | sentences/s (est.) | x teacher beam 5 | "
          f"parameters | size (bytes) | >= {args.goal:g}x |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        forced = f"{r['forced_rate']:.1f}" if "forced_rate" in r else ""
        params = f"{r['parameters']:,}" if "parameters" in r else ""
        size = f"{r['bytes']:,}" if "bytes" in r else ""
        verdict = "" if "passes" not in r or r["model"] == "teacher shape" else (
            "keep" if r["passes"] else "drop"
        )  # fmt: skip
        print(
            f"| {r['model']} | {r['decode']} | {forced} | {r['rate']:.1f} | "
            f"{r['x_beam5']:.2f} | {params} | {size} | {verdict} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
