"""Batch sizes under subword sampling (`data.tokenizer.sampling_alpha`) on local Multi30k.

For each sampling setting, two epochs of the real train loader: the padded size of every
batch, `B x max(S, T)`, over `data.max_tokens`, and the share of sampled sides that fit no draw
and keep their best segmentation (`litmt.data.preparation.subword_sampling`). The "before" row is
what the loader gave before sampled sides had to fit their planned length: the first draw of
every side, in the batches planned on the stored lengths.

    python -m reports.subword_batches                      # 6000 pairs, max_tokens 4096
    python -m reports.subword_batches --limit 2000 --max-tokens 1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from benchmarks.common import MULTI30K
from litmt.data import TranslationDataModule
from litmt.data.preparation.subword_sampling import DRAWS, SampledPairs
from litmt.errors import LitmtError

SETTINGS = [  # (model type, alpha, nbest)
    ("unigram", 0.1, 64),
    ("unigram", 0.5, -1),
    ("unigram", 0.2, -1),
    ("unigram", 0.1, -1),
    ("bpe", 0.1, -1),
]


def costs(dm: TranslationDataModule, first_draws: bool) -> list[int]:
    """`B x max(S, T)` of every batch of epochs 0 and 1 (T counts bos/eos); `first_draws`:
    the first draw of every side, unplanned, in batches planned on the stored lengths."""
    sampled: SampledPairs = dm.datasets["train"]
    ratio = sampled.plan_ratio
    if first_draws:
        sampled.plan_ratio = 1.0
    pos_of = {int(i): p for p, i in enumerate(sampled.indices.tolist())}
    out = []
    for epoch in (0, 1):
        loader = dm.train_dataloader()
        loader.set_epoch(epoch)
        for b in loader:
            if not first_draws:
                out.append(b["src"].shape[0] * max(b["src"].shape[1], b["tgt_in"].shape[1]))
                continue
            sampled.set_epoch(epoch)
            rows = [sampled.first_draw(pos_of[int(i)]) for i in b["index"]]
            out.append(len(rows) * max(max(len(s), len(t) + 1) for _, s, t in rows))
    sampled.plan_ratio = ratio
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default=str(MULTI30K), help="folder with {split}.{lang} files")
    p.add_argument("--limit", type=int, default=6000, help="training pairs")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    args = p.parse_args(argv)
    budget = args.max_tokens
    lines = [
        f"Multi30k en→de, {args.limit} training pairs, `max_tokens={budget}`, two epochs; "
        f"padded size = B × max(S, T) over the budget; {DRAWS} draws per side.",
        "",
        "| model | setting | tokens | batches | batches/epoch | median | max | over budget "
        "| sides kept best |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="litmt-bench-sampling-") as cache:
        for model_type, alpha, nbest in SETTINGS:
            kw = {
                "name": "bench",
                "dir": args.dir,
                "src_lang": "en",
                "tgt_lang": "de",
                "splits": {"train": "train", "valid": "valid", "test": "test2016"},
                "cache_dir": cache,
                "limit": args.limit,
                "tokenizer": {
                    "vocab_size": args.vocab_size,
                    "model_type": model_type,
                    "sampling_alpha": alpha,
                    "sampling_nbest": nbest,
                },
                "max_tokens": budget,
            }
            try:
                dm = TranslationDataModule(**kw)
                dm.prepare_data()
                dm.setup("fit")
            except LitmtError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            sampled: SampledPairs = dm.datasets["train"]
            ratio, kept = sampled.plan_ratio, sampled.fallback_rate(len(sampled))
            setting = f"alpha {alpha}" + (f", nbest {nbest}" if nbest > 0 else "")
            for name, first in (("before", True),
                                ("now", False)):  # fmt: skip
                c = [x / budget for x in costs(dm, first)]
                over = sum(x > 1 for x in c) / len(c)
                kept_cell = "–" if first else f"{100 * kept:.1f} %"
                lines.append(
                    f"| {model_type} {args.vocab_size // 1000}k | {setting} | x{ratio:.2f} "
                    f"| {name} | {len(c) // 2} | {statistics.median(c):.2f} | {max(c):.2f} "
                    f"| {100 * over:.0f} % | {kept_cell} |"
                )
            print(lines[-1], file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
