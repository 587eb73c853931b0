"""Decode speed of an imported Marian of OPUS-MT size: litmt torch, litmt ct2, transformers.

    python -m benchmarks.hf_decode [--threads 2] [--sentences 200] [--beam 4] [--smoke]

Builds a random-weight ``MarianMTModel`` (d=512, 6+6 layers, 8 heads, FFN 2048, swish, tied,
sentencepiece models trained on Multi30k train, or on synthetic text without it), saves it
with ``save_pretrained``, imports it (`litmt.checkpoint.hf_import`) and exports it to
CTranslate2. Every engine decodes the same sentences (Multi30k test2016 English, or synthetic)
with beam 4, length penalty 0 and the same output limit (40 tokens; random weights rarely
emit eos, so outputs run to it), in batches of 32 sentences, on `--threads` threads.
Tokens/s counts the generated tokens (eos excluded) over the median of `--reps` timed runs
after one warm-up. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.common import MULTI30K, median_timed, multi30k_lines
from benchmarks.hf_models import DE_WORDS, EN_WORDS, make_marian_dir, sentences
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.io import save_model_checkpoint
from litmt.deploy.export.ct2 import export_model
from litmt.deploy.loader import load_translator
from litmt.models import Seq2SeqTransformer

LIMIT = 40  # output tokens before eos, every engine


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


def hf_runner(marian: Path, texts: Sequence[str], beam: int) -> Callable[[], int]:
    """transformers' generate over `texts` in batches; returns the generated tokens."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(marian)
    model = AutoModelForSeq2SeqLM.from_pretrained(marian).eval()
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


def litmt_runner(path: Path, engine: str, texts: Sequence[str], beam: int, threads: int):
    """litmt's `engine` over `texts` (the same batches); returns the generated tokens."""
    translator = load_translator(path, engine=engine, device="cpu", threads=threads)
    sources = translator.tokenizer.encode_src(list(texts))
    options = dict(beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=LIMIT)

    def run() -> int:
        n = 0
        for b in batches(sources):
            hyps = translator.search_ids(b, **options)
            n += sum(len(h[0].tokens) for h in hyps)
        return n

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="a tiny model, synthetic text, 8 sentences")
    args = p.parse_args(argv)
    n = 8 if args.smoke else args.sentences
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        marian, ckpt = build(work, args.smoke)
        vocab = len(json.loads((marian / "vocab.json").read_text(encoding="utf-8")))
        ct2_dir = export_model(ckpt, work / "ct2")
        if not args.smoke and (MULTI30K / "test2016.en").is_file():
            texts = multi30k_lines("test2016", "en", n)
        else:
            texts = sentences(EN_WORDS, n, seed=7)
        runners = {
            "litmt torch": litmt_runner(ckpt, "torch", texts, args.beam, args.threads),
            "litmt ct2 (float32)": litmt_runner(ct2_dir, "ct2", texts, args.beam, args.threads),
            "transformers generate": hf_runner(marian, texts, args.beam),
        }
        rows = []
        for name, run in runners.items():
            run()  # warm-up
            tokens, seconds = median_timed(run, args.reps)
            rows.append((name, tokens, seconds))
    print(
        f"{len(texts)} sentences, beam {args.beam}, {args.threads} threads, vocabulary {vocab}, "
        f"{platform.machine()}"
    )
    print("| engine | tokens | seconds | tokens/s |")
    print("|---|---:|---:|---:|")
    for name, tokens, seconds in rows:
        print(f"| {name} | {tokens} | {seconds:.2f} | {tokens / seconds:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
