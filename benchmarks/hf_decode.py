"""Decode speed of every engine against transformers, in one table from one run: litmt torch,
transformers ``generate``, CTranslate2 float32 and int8, ONNX float32 and int8, greedy and beam,
at OPUS-MT size and at a trained checkpoint's size.

    python -m benchmarks.hf_decode [--ckpt recipe.ckpt] [--threads 2] [--sentences 200]
        [--beam 1 5] [--reps 3] [--record ID] [--smoke]

OPUS-MT size: a random-weight ``MarianMTModel`` (d=512, 6+6 layers, 8 heads, FFN 2048,
swish, tied, sentencepiece models trained on Multi30k train, or on synthetic text without it),
saved with ``save_pretrained`` and imported (`litmt.checkpoint.hf_import`). ``--ckpt``: a
litmt checkpoint too (the recipe's size), exported for transformers by ``format=hf``
(`litmt.deploy.export.hf`). Each model is exported to CTranslate2 and ONNX, float32 and int8.
Every engine decodes the same sentences (Multi30k test2016 English, or synthetic) with each
``--beam`` (1: greedy), length penalty 0 and the same output limit (40 tokens; random weights
rarely emit eos, so their outputs run to it), in batches of 32 sentences, on `--threads`
threads. Tokens/s counts the generated tokens (eos excluded) over the median of `--reps` timed
runs after one warm-up, the runs of all engines interleaved (`model_rows`); sentences/s counts
the sentences. Prints a markdown table and the
goals: onnx at least litmt torch, litmt torch at least ``generate``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.common import MULTI30K, median_timed, multi30k_lines, write_result_record
from benchmarks.hf_models import DE_WORDS, EN_WORDS, make_marian_dir, sentences
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.io import save_model_checkpoint
from litmt.deploy.export.ct2 import export_model
from litmt.deploy.export.hf import export_hf
from litmt.deploy.export.onnx import export_onnx
from litmt.deploy.loader import load_translator
from litmt.models import Seq2SeqTransformer

LIMIT = 40  # output tokens before eos, every engine
PAUSE_S = 0.5  # before each timed run: the previous engine's idle threads stop spinning
# engine row -> (litmt engine, export quantization); None: transformers' generate
ENGINES = {
    "litmt torch": ("torch", None),
    "transformers generate": None,
    "ct2 float32": ("ct2", "none"),
    "ct2 int8": ("ct2", "int8"),
    "onnx float32": ("onnx", "none"),
    "onnx int8": ("onnx", "int8"),
}


def build(work: Path, smoke: bool) -> tuple[Path, Path]:
    """The Marian directory and its imported litmt checkpoint under `work`."""
    if not smoke and (MULTI30K / "train.en").is_file():
        en_de = (multi30k_lines("train", "en", 20000), multi30k_lines("train", "de", 20000))
        spm_size = 8000
    else:
        en_de = (sentences(EN_WORDS, 2000), sentences(DE_WORDS, 2000, seed=1))
        spm_size = 100
    size = dict(d_model=64, layers=2, heads=4, ffn=128) if smoke else {}
    full = dict(d_model=512, layers=6, heads=8, ffn=2048)
    marian = make_marian_dir(
        work / "marian", **{**full, **size}, en_de=en_de, spm_size=spm_size, init_std=0.05,
        eos_bias=0.0, max_positions=512,
    )  # fmt: skip
    imported = read_hf_dir(marian)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    ckpt = save_model_checkpoint(
        work / "imported.ckpt", model, imported.tokenizer, imported.src_lang, imported.tgt_lang
    )
    return marian, ckpt


def batches(items: Sequence, size: int = 32) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def hf_runner(hf_dir: Path, texts: Sequence[str], beam: int) -> Callable[[], int]:
    """transformers' generate over `texts` in batches; returns the generated tokens."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    encoded = [tok(list(b), return_tensors="pt", padding=True) for b in batches(texts)]
    eos, pad = model.config.eos_token_id, model.config.pad_token_id

    def run() -> int:
        n = 0
        with torch.no_grad():
            for enc in encoded:
                out = model.generate(
                    **enc, num_beams=beam, do_sample=False, length_penalty=0.0,
                    early_stopping=True, max_new_tokens=LIMIT + 1,
                )[:, 1:]  # fmt: skip
                n += int((out.ne(eos) & out.ne(pad)).sum())
        return n

    return run


def litmt_runner(translator, texts: Sequence[str], beam: int) -> Callable[[], int]:
    """A litmt translator over `texts` (the same batches); returns the generated tokens."""
    sources = translator.tokenizer.encode_src(list(texts))
    options = dict(beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=LIMIT)

    def run() -> int:
        n = 0
        for b in batches(sources):
            hyps = translator.search_ids(b, **options)
            n += sum(len(h[0].tokens) for h in hyps)
        return n

    return run


def model_rows(
    name: str, ckpt: Path, hf_dir: Path, work: Path, texts: Sequence[str], args
) -> list[dict]:
    """Every engine of `ENGINES` x every ``--beam`` on one model: its rows of the table.

    The runs are interleaved: after one warm-up of each, every repetition times each engine
    and search once, in turn, after a pause of `PAUSE_S`, and a row keeps its median. So a
    slow spell of the machine falls on every engine alike instead of on whichever engine ran
    then, and no run starts while the previous engine's threads still spin."""
    runs: list[tuple[str, int, Callable[[], int]]] = []
    for engine, how in ENGINES.items():
        if how is None:
            make = lambda beam: hf_runner(hf_dir, texts, beam)  # noqa: E731
        else:
            kind, quantization = how
            path = ckpt
            if kind == "ct2":
                path = export_model(ckpt, work / f"ct2-{quantization}", quantization=quantization)
            elif kind == "onnx":
                path = export_onnx(ckpt, work / f"onnx-{quantization}", quantization=quantization)
            translator = load_translator(path, engine=kind, device="cpu", threads=args.threads)
            make = lambda beam, t=translator: litmt_runner(t, texts, beam)  # noqa: E731
        for beam in args.beam:
            run = make(beam)
            run()  # warm-up
            runs.append((engine, beam, run))
    seconds: dict[tuple[str, int], list[float]] = {(e, b): [] for e, b, _ in runs}
    tokens: dict[tuple[str, int], int] = {}
    for _ in range(args.reps):
        for engine, beam, run in runs:
            time.sleep(PAUSE_S)
            tokens[(engine, beam)], took = median_timed(run, 1)
            seconds[(engine, beam)].append(took)
    return [
        {"model": name, "engine": engine, "beam": beam, "tokens": tokens[(engine, beam)],
         "seconds": statistics.median(seconds[(engine, beam)]), "sentences": len(texts)}
        for engine, beam, _ in runs
    ]  # fmt: skip


def goals(rows: list[dict]) -> list[str]:
    """Per model and search: onnx (float32 and int8) against litmt torch, litmt torch against
    generate (tokens/s)."""
    out = []
    rate = {(r["model"], r["engine"], r["beam"]): r["tokens"] / r["seconds"] for r in rows}
    for model, beam in dict.fromkeys((r["model"], r["beam"]) for r in rows):
        torch_rate = rate[(model, "litmt torch", beam)]
        search = "greedy" if beam == 1 else f"beam {beam}"
        for onnx in ("onnx float32", "onnx int8"):
            x = rate[(model, onnx, beam)] / torch_rate
            out.append(f"{model}, {search}: {onnx} = {x:.2f}x litmt torch (goal >= 1)")
        x = torch_rate / rate[(model, "transformers generate", beam)]
        out.append(f"{model}, {search}: litmt torch = {x:.2f}x generate (goal >= 1)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", default=None, help="also a litmt checkpoint (the recipe's size)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--beam", type=int, nargs="+", default=[1, 5], help="searches (1: greedy)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--record", default=None, help="also write docs/results/records/<ID>.json")
    p.add_argument("--smoke", action="store_true", help="a tiny model, synthetic text, 8 sentences")
    args = p.parse_args(argv)
    n = 8 if args.smoke else args.sentences
    torch.set_num_threads(args.threads)
    if not args.smoke and (MULTI30K / "test2016.en").is_file():
        texts = multi30k_lines("test2016", "en", n)
    else:
        texts = sentences(EN_WORDS, n, seed=7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        marian, imported = build(work / "opus", args.smoke)
        vocab = len(json.loads((marian / "vocab.json").read_text(encoding="utf-8")))
        rows += model_rows("OPUS-MT size", imported, marian, work / "opus", texts, args)
        if args.ckpt:
            hf_dir = export_hf(args.ckpt, work / "ckpt" / "hf")
            rows += model_rows(
                Path(args.ckpt).name, Path(args.ckpt), hf_dir, work / "ckpt", texts, args
            )
    print(
        f"{len(texts)} sentences, {args.threads} threads, length penalty 0, at most {LIMIT} "
        f"tokens, batches of 32; OPUS-MT size vocabulary {vocab}; {platform.machine()}"
    )
    print("| model | engine | search | tokens | seconds | tokens/s | sentences/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        print(
            f"| {r['model']} | {r['engine']} | {search} | {r['tokens']} | {r['seconds']:.2f} | "
            f"{r['tokens'] / r['seconds']:.0f} | {r['sentences'] / r['seconds']:.1f} |"
        )
    print("\n".join(goals(rows)))
    if args.record:
        values, units = {}, {}
        for r in rows:
            model = "opus" if r["model"] == "OPUS-MT size" else "ckpt"
            engine = r["engine"].replace("litmt ", "").replace("transformers ", "")
            key = f"{model}_{engine.replace(' ', '_')}_{'greedy' if r['beam'] == 1 else 'beam' + str(r['beam'])}"
            values[f"{key}_tokens_per_s"] = round(r["tokens"] / r["seconds"], 1)
            units[f"{key}_tokens_per_s"] = "tokens/s"
        path = write_result_record(
            args.record,
            "Decode speed of every engine against transformers generate (tokens/s)",
            "benchmarks.hf_decode",
            sys.argv[1:] if argv is None else argv,
            values,
            units,
            notes=f"{len(texts)} test2016 sentences, {args.threads} threads, length penalty 0, "
            f"at most {LIMIT} tokens, batches of 32; median of {args.reps} runs, the engines' "
            "runs interleaved; opus = a random-weight Marian of OPUS-MT size, imported; "
            "ckpt = --ckpt",
        )
        print(f"result record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
