"""Encoding speed of the subword samplers (`litmt.data.tokenization.segmentation`) on local Multi30k.

Trains the recipe's tokenizer (joint unigram, 6000 pieces) on Multi30k en-de train, encodes
the first `--n` English training sentences one call per sentence (as `SampledPairs` does),
one thread, for: the best segmentation; sentencepiece's own sampler (nbest -1 and 64); and
litmt's seeded n-best sampler (64 and 8). Prints microseconds per sentence and whether a
seed repeats its segmentation in a new process (measured by this script, in two children).

    python -m benchmarks.subword_samplers            # 2000 sentences
    python -m benchmarks.subword_samplers --n 500 --dir DIR --vocab-size 1000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sentencepiece as spm

from benchmarks.common import MULTI30K
from litmt.data.tokenization.segmentation import SubwordSampling, encode_texts
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig

ALPHA = 0.1
ROWS = [  # (label, nbest or None for the best segmentation)
    ("best segmentation", None),
    ("sentencepiece, nbest -1 (lattice)", -1),
    ("sentencepiece, nbest 64", "spm64"),
    ("litmt seeded, nbest 64", 64),
    ("litmt seeded, nbest 8", 8),
]

_CHILD = """
import json, sys
import sentencepiece as spm
from litmt.data.tokenization.segmentation import SubwordSampling, encode_texts
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
texts = json.loads(sys.argv[3])
nbest, alpha = sys.argv[2], float(sys.argv[4])
out = []
for seed, text in enumerate(texts):
    if nbest == "spm64":
        spm.set_random_generator_seed(seed + 1)
        out.append(sp.encode([text], enable_sampling=True, alpha=alpha, nbest_size=64,
                             num_threads=1)[0])
    else:
        out.append(encode_texts(sp, [text], SubwordSampling(alpha, int(nbest), seed=seed + 1))[0])
print(json.dumps(out))
"""


def encode_one(sp: spm.SentencePieceProcessor, text: str, nbest: object, seed: int) -> list:
    """One sentence's ids under the row's setting."""
    if nbest is None:
        return sp.encode([text])[0]
    if nbest == "spm64":
        spm.set_random_generator_seed(seed)
        return sp.encode([text], enable_sampling=True, alpha=ALPHA, nbest_size=64, num_threads=1)[0]
    return encode_texts(sp, [text], SubwordSampling(ALPHA, int(nbest), seed=seed))[0]


def repeats(model: Path, nbest: object, texts: list[str]) -> str:
    """'yes' when two fresh processes draw the same segmentations for the same seeds."""
    if nbest is None:
        return "(no sampling)"
    run = [sys.executable, "-c", _CHILD, str(model), str(nbest), json.dumps(texts), str(ALPHA)]
    a, b = (json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
            for _ in range(2))  # fmt: skip
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return f"{'yes' if same == len(a) else 'no'} ({same}/{len(a)} sentences)"


def main(argv: list[str] | None = None) -> int:
    """Print the table; 0 on success."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=MULTI30K, help="train.en / train.de live here")
    ap.add_argument("--n", type=int, default=2000, help="sentences to encode")
    ap.add_argument("--vocab-size", type=int, default=6000, help="the recipe's: 6000")
    args = ap.parse_args(argv)
    if not (args.dir / "train.en").is_file():
        sys.exit(f"no training text train.en in {args.dir}")
    src = (args.dir / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (args.dir / "train.de").read_text(encoding="utf-8").splitlines()
    tok = Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=args.vocab_size))
    src = src[: args.n]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "joint.model"
        model.write_bytes(tok.src_model_bytes)
        sp = tok.src
        print(f"{len(src)} sentences of {args.dir.name} train.en, alpha {ALPHA}, one call each")
        print("| sampler | µs per sentence | same seed, new process: same segmentation |")
        print("|---|---:|---|")
        for label, nbest in ROWS:
            t0 = time.perf_counter()
            for i, text in enumerate(src):
                encode_one(sp, text, nbest, i + 1)
            us = (time.perf_counter() - t0) / len(src) * 1e6
            print(f"| {label} | {us:.0f} | {repeats(model, nbest, src[:200])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
