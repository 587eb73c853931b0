"""Terminology constraints and target prefixes on Multi30k test2016 (tables for a lab notebook page, docs/notebook/).

    python -m benchmarks.benchmark_constraints --ckpt model.ckpt --beams 5 10 --prefix-lines 0

(a) Constraints: a term dictionary from the references. The greedy output of every test
    sentence; per sentence, up to `--per-sentence` reference words it misses (the rarest in
    the references, then the longest; words are whitespace tokens without edge punctuation,
    compared case-sensitively; a word with characters the model's vocabulary lacks is left
    out and counted) become its terms. Then, at each beam of `--beams`, the beam search
    without and with the terms as constraints (`litmt.decoding.search.constrained`). Reported per
    beam: the share of terms in the output as a whole word and in their exact form (as a
    substring: the model may continue a word, "Hund" + "e"), the sentences flagged
    ``constraints_met: false`` (the search could not meet them all within the budget), the
    share of terms met or flagged (the goal: 100 %), BLEU without and with the terms
    (sacreBLEU via `litmt.metrics`), and sentences/s of both searches with their ratio.
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
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchmark_engines import ensure_export
from benchmarks.common import MULTI30K, checkpoint_run
from litmt.cli.script.exits import cli_errors
from litmt.decoding.analysis.forced import ForcedDecoder
from litmt.decoding.steering import check_known_pieces
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.errors import ConfigError
from litmt.metrics import corpus_bleu

EDGE = ".,;:!?\"'()[]«»„“”"


def words(text: str) -> list[str]:
    """Whitespace tokens without edge punctuation (empty ones dropped)."""
    return [w.strip(EDGE) for w in text.split() if w.strip(EDGE)]


def pick_constraints(hyp: str, ref: str, k: int, freq: Counter[str]) -> list[str]:
    """Up to `k` reference words missing from `hyp` (as whole words): the rarest in the
    references (`freq`) first, then the longest, then by position."""
    have = set(words(hyp))
    missing = list(dict.fromkeys(w for w in words(ref) if w not in have))
    return sorted(missing, key=lambda w: (freq[w], -len(w)))[:k]


def term_dictionary(
    tr: Translator, greedy: list[str], ref: list[str], k: int
) -> tuple[list[list[str]], int]:
    """Per sentence, its terms (`pick_constraints`), and how many were left out because the
    model's vocabulary lacks some of their characters (`check_known_pieces` refuses them)."""
    freq = Counter(w for r in ref for w in words(r))
    terms, unknown = [], 0
    for hyp, r in zip(greedy, ref, strict=True):
        kept = []
        for w in pick_constraints(hyp, r, k, freq):
            try:
                check_known_pieces(tr.tokenizer, w, tr.tokenizer.encode_tgt([w])[0], "term")
            except ConfigError:
                unknown += 1
                continue
            kept.append(w)
        terms.append(kept)
    return terms, unknown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint (Multi30k en-de)")
    p.add_argument("--src", default=str(MULTI30K / "test2016.en"), help="source file")
    p.add_argument("--ref", default=str(MULTI30K / "test2016.de"), help="reference file")
    p.add_argument("--beams", type=int, nargs="+", default=[5, 10], help="beam sizes (a)")
    p.add_argument("--beam", type=int, default=5, help="beam size of the prefix part (b)")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty of every search")
    p.add_argument("--per-sentence", type=int, default=2, help="constraints per sentence (max)")
    p.add_argument(
        "--prefix-lines", type=int, default=200, help="sentences of the prefix part (0: skip)"
    )
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


def beam_row(
    tr: Translator, src: list[str], ref: list[str], terms: list[list[str]], beam: int, args: Any
) -> dict[str, Any]:
    """Beam search without and with the terms at one beam size: coverage, flags, BLEU, speed."""
    options = dict(beam_size=beam, length_penalty=args.alpha)
    tr.translate(src[:16], **options)  # warm-up
    plain, t_plain = timed(lambda: tr.translate(src, **options))
    found, t_cons = timed(lambda: tr.translations(src, constraints=terms, **options))
    steered = [row[0].text for row in found]
    flagged = [i for i, row in enumerate(found) if not row[0].constraints_met]
    pairs = [(i, c, h) for i, (h, cs) in enumerate(zip(steered, terms, strict=True)) for c in cs]
    return {
        "beam": beam,
        "found_as_word": sum(c in words(h) for _, c, h in pairs),
        "found_exact": sum(c in h for _, c, h in pairs),
        "met_or_flagged": sum(c in h or i in flagged for i, c, h in pairs),
        "flagged_sentences": len(flagged),
        "missed": [(i + 1, c, h) for i, c, h in pairs if c not in h][:10],
        "not_a_word": [(i + 1, c, h) for i, c, h in pairs if c in h and c not in words(h)][:10],
        "bleu_plain": corpus_bleu(plain, ref),
        "bleu_constrained": corpus_bleu(steered, ref),
        "seconds_plain": t_plain,
        "seconds_constrained": t_cons,
        "examples": [(src[i], terms[i], plain[i], steered[i]) for i in range(len(src)) if terms[i]][
            :3
        ],
    }


def constraints_part(tr: Translator, src: list[str], ref: list[str], args: Any) -> dict:
    """The term dictionary from the greedy output, then `beam_row` at every beam of --beams."""
    greedy, t_greedy = timed(lambda: tr.translate(src, method="greedy"))
    terms, unknown = term_dictionary(tr, greedy, ref, args.per_sentence)
    return {
        "sentences": len(src),
        "constrained_sentences": sum(1 for t in terms if t),
        "constraints": sum(len(t) for t in terms),
        "left_out_unknown_characters": unknown,
        "bleu_greedy": corpus_bleu(greedy, ref),
        "seconds_greedy": t_greedy,
        "beams": [beam_row(tr, src, ref, terms, beam, args) for beam in args.beams],
    }


def print_constraints(a: dict[str, Any], args: Any) -> None:
    """Part (a) as a markdown table, with examples and every miss."""
    n, c = a["sentences"], max(a["constraints"], 1)
    print(
        f"(a) terms: {a['constraints']} on {a['constrained_sentences']} of {n} sentences (up "
        f"to {args.per_sentence} per sentence: the rarest reference words the greedy output "
        f"misses; {a['left_out_unknown_characters']} left out: characters the vocabulary "
        f"lacks)\n"
    )
    print("| search | terms found (whole word / exact form) | met or flagged | flagged "
          "sentences | BLEU | sentences/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| greedy (the terms' source) | - | - | - | {a['bleu_greedy']:.2f} | "
          f"{n / a['seconds_greedy']:.1f} |")  # fmt: skip
    for r in a["beams"]:
        b = r["beam"]
        print(f"| beam {b} | - | - | - | {r['bleu_plain']:.2f} | {n / r['seconds_plain']:.1f} |")
        print(
            f"| beam {b} + terms (DBA) | {100 * r['found_as_word'] / c:.1f} % / "
            f"{100 * r['found_exact'] / c:.1f} % | {100 * r['met_or_flagged'] / c:.1f} % | "
            f"{r['flagged_sentences']} | {r['bleu_constrained']:.2f} "
            f"({r['bleu_constrained'] - r['bleu_plain']:+.2f}) | "
            f"{n / r['seconds_constrained']:.1f} "
            f"({r['seconds_plain'] / r['seconds_constrained']:.2f}x) |"
        )
    for r in a["beams"]:
        for line, cons, plain, steered in r["examples"]:
            print(f"\n  beam {r['beam']}: {line}\n  terms: {cons}\n  plain: {plain}\n"
                  f"  with terms: {steered}")  # fmt: skip
        for line, term, h in r["missed"]:
            print(f"\n  beam {r['beam']}, line {line}: {term!r} not in {h!r}")
        for line, term, h in r["not_a_word"]:
            print(f"\n  beam {r['beam']}, line {line}: {term!r} inside a longer word: {h!r}")


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
        src, ref, ckpt, tr = checkpoint_run(args)
        a = constraints_part(tr, src, ref, args)
        b = None
        if args.prefix_lines > 0:
            with tempfile.TemporaryDirectory() as tmp:
                exports = Path(args.exports) if args.exports else Path(tmp)
                ct2 = CT2Translator(ensure_export(ckpt, exports, "none"), threads=args.threads)
                b = prefix_part(tr, ct2, src, ref, args)
    print(
        f"{len(src)} sentences of {Path(args.src).name}, length penalty {args.alpha}, "
        f"{args.threads} thread(s); torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    print_constraints(a, args)
    if b is not None:
        print_prefix(b, args)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "constraints": a, "prefix": b}, indent=2, default=str)
        )
    return 0


def print_prefix(b: dict[str, Any], args: Any) -> None:
    """Part (b) as a markdown table, with every difference."""
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


if __name__ == "__main__":
    sys.exit(main())
