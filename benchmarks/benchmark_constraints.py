"""Terminology constraints and target prefixes on Multi30k test2016 (tables for docs/benchmarks.md).

    python -m benchmarks.benchmark_constraints --ckpt model.ckpt

(a) Constraints: the unconstrained beam output of every test sentence; per sentence, up to
    `--per-sentence` reference words it misses (the longest ones, so content words rather than
    articles; words are whitespace tokens without edge punctuation, compared case-sensitively)
    become its constraints; then the constrained beam search (`litmt.decoding.constraints`).
    Reported: the share of constraints found in the output (as a whole word, and as a
    substring: the model may continue a constrained word, "Hund" + "e"), BLEU without and with
    constraints (sacreBLEU via `litmt.metrics`), and sentences/s of both searches.
(b) Prefix: on the first `--prefix-lines` sentences, the first `--prefix-words` words of the
    reference as the prefix, decoded by the torch and the ct2 engine (same beam): how many
    outputs are identical; each difference is scored by the torch model (ForcedDecoder) to
    tell near-ties from real disagreements. Then the full reference as the prefix: how many
    outputs reproduce it (as text and as the reference's own token ids), on both engines.
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
from benchmarks.common import MULTI30K, parallel_lines
from litmt.cli.exits import cli_errors
from litmt.decoding.forced import ForcedDecoder
from litmt.decoding.translator import Translator
from litmt.deploy.ct2_engine import CT2Translator
from litmt.metrics import corpus_bleu

EDGE = ".,;:!?\"'()[]«»„“”"


def words(text: str) -> list[str]:
    """Whitespace tokens without edge punctuation (empty ones dropped)."""
    return [w.strip(EDGE) for w in text.split() if w.strip(EDGE)]


def pick_constraints(hyp: str, ref: str, k: int) -> list[str]:
    """Up to `k` reference words missing from `hyp`: the longest first, then by position."""
    have = set(words(hyp))
    missing = []
    for w in words(ref):
        if w not in have and w not in missing:
            missing.append(w)
    return sorted(missing, key=lambda w: -len(w))[:k]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint (Multi30k en-de)")
    p.add_argument("--src", default=str(MULTI30K / "test2016.en"), help="source file")
    p.add_argument("--ref", default=str(MULTI30K / "test2016.de"), help="reference file")
    p.add_argument("--beam", type=int, default=5, help="beam size of every search")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty of every search")
    p.add_argument("--per-sentence", type=int, default=2, help="constraints per sentence (max)")
    p.add_argument("--prefix-lines", type=int, default=200, help="sentences of the prefix part")
    p.add_argument("--prefix-words", type=int, default=2, help="reference words in the prefix")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of both engines")
    p.add_argument("--limit", type=int, default=0, help="use the first N sentences (0 = all)")
    p.add_argument("--exports", default=None, help="where the ct2 export is written/reused")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p.parse_args(argv)


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def constraints_part(tr: Translator, src: list[str], ref: list[str], args: Any) -> dict:
    options = dict(beam_size=args.beam, length_penalty=args.alpha)
    tr.translate(src[:16], **options)  # warm-up
    plain, t_plain = timed(lambda: tr.translate(src, **options))
    cons = [pick_constraints(h, r, args.per_sentence) for h, r in zip(plain, ref, strict=True)]
    steered, t_cons = timed(lambda: tr.translate(src, constraints=cons, **options))
    total = sum(len(c) for c in cons)
    as_word = sum(c in words(h) for h, cs in zip(steered, cons, strict=True) for c in cs)
    as_sub = sum(c in h for h, cs in zip(steered, cons, strict=True) for c in cs)
    missed = [
        (i, c, h)
        for i, (h, cs) in enumerate(zip(steered, cons, strict=True))
        for c in cs
        if c not in h
    ]
    return {
        "sentences": len(src),
        "constrained_sentences": sum(1 for c in cons if c),
        "constraints": total,
        "found_as_word": as_word,
        "found_as_substring": as_sub,
        "missed": missed[:10],
        "not_a_word": [
            (i + 1, c, h)
            for i, (h, cs) in enumerate(zip(steered, cons, strict=True))
            for c in cs
            if c in h and c not in words(h)
        ][:10],
        "bleu_plain": corpus_bleu(plain, ref),
        "bleu_constrained": corpus_bleu(steered, ref),
        "seconds_plain": t_plain,
        "seconds_constrained": t_cons,
        "examples": [(src[i], cons[i], plain[i], steered[i]) for i in range(len(src)) if cons[i]][
            :3
        ],
    }


def prefix_part(tr: Translator, ct2: CT2Translator, src: list[str], ref: list[str], args) -> dict:
    n = args.prefix_lines
    src, ref = src[:n], ref[:n]
    prefixes = [" ".join(r.split()[: args.prefix_words]) for r in ref]
    options = dict(beam_size=args.beam, length_penalty=args.alpha, return_scores=True)
    a, t_torch = timed(lambda: tr.translate(src, prefixes=prefixes, **options))
    b, t_ct2 = timed(lambda: ct2.translate(src, prefixes=prefixes, **options))
    differ = [i for i in range(n) if a[i][0][0] != b[i][0][0]]
    forced = ForcedDecoder(tr)
    gaps = []
    for i in differ:  # both outputs scored by the torch model: how far apart are they?
        fa, fb = forced.force_decode(
            [src[i], src[i]], [a[i][0][0], b[i][0][0]], length_penalty=args.alpha
        )
        gaps.append(
            {
                "line": i + 1,
                "torch": a[i][0][0],
                "ct2": b[i][0][0],
                "torch_score": fa.score,
                "ct2_score_under_torch": fb.score,
                "gap": fa.score - fb.score,
            }
        )
    starts = sum(h[0][0].startswith(p) for h, p in zip(a, prefixes, strict=True))
    starts_ct2 = sum(h[0][0].startswith(p) for h, p in zip(b, prefixes, strict=True))
    full: dict[str, Any] = {}
    ref_ids = tr.tokenizer.encode_tgt(ref)
    ids = [tr.prepare(s) for s in src]
    for name, engine in (("torch", tr), ("ct2", ct2)):
        pids, _ = engine.encode_steering(n, ref)
        found = engine.search_ids(
            ids, prefixes=pids, beam_size=args.beam, length_penalty=args.alpha
        )
        texts = engine.tokenizer.decode_tgt([h[0].tokens for h in found])
        full[name] = {
            "text_equal": sum(t == r for t, r in zip(texts, ref, strict=True)),
            "ids_equal": sum(h[0].tokens == r for h, r in zip(found, ref_ids, strict=True)),
            "starts_with_ids": sum(
                h[0].tokens[: len(r)] == r for h, r in zip(found, ref_ids, strict=True)
            ),
            "others": [(i + 1, ref[i], texts[i]) for i in range(n) if texts[i] != ref[i]][:6],
        }
    return {
        "lines": n,
        "identical": n - len(differ),
        "differences": gaps,
        "start_with_prefix_torch": starts,
        "start_with_prefix_ct2": starts_ct2,
        "seconds_torch": t_torch,
        "seconds_ct2": t_ct2,
        "full_reference_prefix": full,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with cli_errors():
        src, ref = parallel_lines(args.src, args.ref, args.limit)
        torch.set_num_threads(args.threads)
        ckpt = Path(args.ckpt)
        tr = Translator.from_checkpoint(ckpt, device="cpu")
        a = constraints_part(tr, src, ref, args)
        with tempfile.TemporaryDirectory() as tmp:
            exports = Path(args.exports) if args.exports else Path(tmp)
            ct2 = CT2Translator(ensure_export(ckpt, exports, "none"), threads=args.threads)
            b = prefix_part(tr, ct2, src, ref, args)
    print(
        f"{len(src)} sentences of {Path(args.src).name}, beam {args.beam}, length penalty "
        f"{args.alpha}, {args.threads} "
        f"thread(s); torch {torch.__version__}, {platform.processor() or platform.machine()}\n"
    )
    n = a["sentences"]
    print(
        f"(a) constraints: {a['constraints']} constraints on {a['constrained_sentences']} of "
        f"{n} sentences (up to {args.per_sentence} reference words the plain output misses)\n"
    )
    print("| search | constraints found (word / substring) | BLEU | sentences/s |")
    print("|---|---:|---:|---:|")
    c = max(a["constraints"], 1)
    print(f"| beam {args.beam} | - | {a['bleu_plain']:.2f} | {n / a['seconds_plain']:.1f} |")
    print(
        f"| beam {args.beam} + constraints (DBA) | {100 * a['found_as_word'] / c:.1f} % / "
        f"{100 * a['found_as_substring'] / c:.1f} % | {a['bleu_constrained']:.2f} "
        f"({a['bleu_constrained'] - a['bleu_plain']:+.2f}) | {n / a['seconds_constrained']:.1f} "
        f"({a['seconds_plain'] / a['seconds_constrained']:.2f}x) |"
    )
    for line, cons, plain, steered in a["examples"]:
        print(f"\n  src: {line}\n  constraints: {cons}\n  plain: {plain}\n  constrained: {steered}")
    if a["missed"]:
        print(f"\n  not found as a substring: {a['missed']}")
    for line, c, h in a["not_a_word"]:
        print(f"\n  found inside a longer word, line {line}: {c!r} in {h!r}")
    print(
        f"\n(b) prefix = the first {args.prefix_words} reference words, {b['lines']} lines, "
        f"beam {args.beam}\n"
    )
    print("| check | torch | ct2 |")
    print("|---|---:|---:|")
    print(f"| outputs identical on both engines | {b['identical']} / {b['lines']} | |")
    print(
        f"| output starts with the prefix | {b['start_with_prefix_torch']} | "
        f"{b['start_with_prefix_ct2']} |"
    )
    full = b["full_reference_prefix"]
    for key, label in (
        ("text_equal", "text"),
        ("ids_equal", "token ids"),
        ("starts_with_ids", "output starts with its ids"),
    ):
        print(
            f"| full reference as prefix reproduces it ({label}) | {full['torch'][key]} | "
            f"{full['ct2'][key]} |"
        )
    print(f"| seconds (prefix run) | {b['seconds_torch']:.1f} | {b['seconds_ct2']:.1f} |")
    for name in ("torch", "ct2"):
        for line, r, t in full[name]["others"]:
            print(f"\n  {name} line {line}: reference {r!r}\n    output {t!r}")
    for d in b["differences"]:
        print(
            f"\n  line {d['line']}: torch {d['torch']!r} ({d['torch_score']:.4f}) vs ct2 "
            f"{d['ct2']!r} ({d['ct2_score_under_torch']:.4f} under torch; gap {d['gap']:.2e})"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "constraints": a, "prefix": b}, indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
