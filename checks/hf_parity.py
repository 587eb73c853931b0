"""Export parity on a real checkpoint: ``format=hf`` against litmt, on Multi30k test2016.

    python -m checks.hf_parity --ckpt CKPT [--out DIR] [--limit N] [--round-trip]

A multilingual checkpoint is compared in each of its directions from --src (en), each with
the model card's call (`litmt.deploy.export.hf.direction_calls`), and reported per direction
under "directions"; the top-level figures are the worst direction's.

1. Exports CKPT with ``format=hf`` (to --out, or a temporary directory).
2. Logits: teacher-forced on litmt's greedy outputs, max |Δlogit| between litmt and
   ``AutoModelForSeq2SeqLM`` on the same ids (fp32).
3. Greedy: transformers' translation of every line (``pipeline("translation")`` where the
   installed transformers has it; transformers 5 removed that task, so there the same
   steps the pipeline ran: AutoTokenizer, ``generate``, ``decode(skip_special_tokens=True)``,
   batched by output limit)
   against litmt's greedy output, with litmt's output budget (``max_new_tokens`` = budget + 1).
   Every differing line is printed with the two outputs and litmt's gap where they part; one
   within ``NEAR_TIE`` counts as a near-tie (the parity rule of `checks.decode_margins`).
4. --round-trip: imports the export again (``scripts/import_hf.py``'s code) and checks the
   two litmt checkpoints give identical translations (beam search, the default decoding).

Prints one JSON line with the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.common import multi30k_lines
from checks.decode_margins import NEAR_TIE, max_excused, parting_gap
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.data.tokenization.tokenizer import BOS_ID
from litmt.decoding.search.rules import output_budgets
from litmt.decoding.translator import Translator
from litmt.deploy.export.hf import direction_calls, export_hf
from litmt.models import Seq2SeqTransformer

DEFAULT = {"max_len_a": 1.2, "max_len_b": 10}  # DecodeConfig's output budget


def has_translation_pipeline() -> bool:
    """Whether the installed transformers still has the "translation" pipeline task."""
    from transformers.pipelines import SUPPORTED_TASKS

    return "translation" in SUPPORTED_TASKS


def hf_translate(
    model_dir: str | Path,
    texts: Sequence[str],
    max_new_tokens: Sequence[int],
    num_beams: int = 1,
    direction: tuple[str, str] | None = None,
) -> list[str]:
    """Translate with transformers alone (see the module docstring), one sentence at a time.

    `direction`: a multilingual export's (language token, placement), the model card's call
    (`litmt.deploy.export.hf.direction_calls`): placement "target" passes
    ``forced_bos_token_id`` = the token's id to ``generate``; "source" starts each text with
    ``"<2xx> "``. None: a one-pair model.
    """
    options: dict[str, int] = {}
    if direction is not None and direction[1] == "source":
        texts = [f"{direction[0]} {t}" for t in texts]
    if has_translation_pipeline():
        from transformers import pipeline

        translate = pipeline("translation", model=str(model_dir), device="cpu")
        if direction is not None and direction[1] == "target":
            options["forced_bos_token_id"] = translate.tokenizer.convert_tokens_to_ids(direction[0])
        return [
            translate(t, num_beams=num_beams, do_sample=False, max_new_tokens=int(n), **options)[0][
                "translation_text"
            ]
            for t, n in zip(texts, max_new_tokens, strict=True)
        ]
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    if direction is not None and direction[1] == "target":
        options["forced_bos_token_id"] = tok.convert_tokens_to_ids(direction[0])
    out: list[str] = [""] * len(texts)
    by_limit: dict[int, list[int]] = {}  # sentences of one max_new_tokens decode in batches
    for i, n in enumerate(max_new_tokens):
        by_limit.setdefault(int(n), []).append(i)
    with torch.no_grad():
        for n, rows in by_limit.items():
            for start in range(0, len(rows), 32):
                idx = rows[start : start + 32]
                enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True)
                ids = model.generate(
                    **enc, num_beams=num_beams, do_sample=False, max_new_tokens=n, **options
                )
                for i, text in zip(
                    idx, tok.batch_decode(ids, skip_special_tokens=True), strict=True
                ):
                    out[i] = text
    return out


def max_logit_difference(model_dir: Path, translator: Translator, sources, hyps) -> float:
    """max |Δlogit| over teacher-forced (bos + hypothesis) positions, in batches of 32."""
    from transformers import AutoModelForSeq2SeqLM

    hf = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    worst = 0.0
    for i in range(0, len(sources), 32):
        src, tgt = sources[i : i + 32], [[BOS_ID, *h] for h in hyps[i : i + 32]]
        s = torch.zeros(len(src), max(map(len, src)), dtype=torch.long)  # (B, S), pad 0
        t = torch.zeros(len(tgt), max(map(len, tgt)), dtype=torch.long)  # (B, T)
        for j, (a, b) in enumerate(zip(src, tgt, strict=True)):
            s[j, : len(a)], t[j, : len(b)] = torch.tensor(a), torch.tensor(b)
        with torch.no_grad():
            ours = translator.model(s, t)  # (B, T, V)
            theirs = hf(input_ids=s, attention_mask=s.ne(0).long(), decoder_input_ids=t).logits
        real = t.ne(0)
        real[:, 0] = True  # (B, T) positions of bos + hypothesis
        worst = max(worst, float((ours - theirs).abs()[real].max()))
    return worst


def round_trip(
    ckpt: Path, model_dir: Path, lines: Sequence[str], pairs: Sequence[tuple[str, str]]
) -> dict[str, object]:
    """Translate `lines` with CKPT and with the re-imported export (default decoding), in
    every direction of `pairs` (None, None: a one-pair model)."""
    first = Translator.from_checkpoint(ckpt, device="cpu")
    imported = read_hf_dir(model_dir)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    second = Translator(
        model, imported.tokenizer, device="cpu", languages=imported.languages,
        src_lang=imported.src_lang, tgt_lang=imported.tgt_lang,
    )  # fmt: skip
    same = total = 0
    for src, tgt in pairs:
        a = first.translate(lines, src_lang=src, tgt_lang=tgt)
        b = second.translate(lines, src_lang=src, tgt_lang=tgt)
        same += sum(x == y for x, y in zip(a, b, strict=True))
        total += len(lines)
    return {"round_trip_identical": same, "round_trip_lines": total}


def direction_parity(
    translator: Translator, out: Path, lines: Sequence[str], pair: tuple[str | None, str | None]
) -> dict[str, object]:
    """Greedy and logit parity of one direction (`pair`: None, None for a one-pair model).

    A differing line whose outputs part where litmt's model holds them within `NEAR_TIE`
    (`parting_gap`, the parity rule of `checks.decode_margins`) counts as a near-tie; the
    others are real differences. ``near_ties_within_cap``: at most `max_excused` of the lines."""
    route = translator.languages.route(translator.tokenizer, *pair)
    plain = translator.tokenizer.encode_src(lines)
    sources = [route.source_ids(x, translator.max_source_tokens) for x in plain]
    prefix = route.prefix_ids(None) or []
    prefixes = [prefix] * len(sources) if prefix else None
    hyps = [h[0].tokens for h in translator.search_ids(sources, method="greedy", prefixes=prefixes)]
    ours = translator.tokenizer.decode_tgt(hyps)
    budget = output_budgets(
        [len(s) for s in sources], DEFAULT["max_len_a"], DEFAULT["max_len_b"], 10**9
    )
    calls = direction_calls(translator.languages_meta())
    direction = calls.get(f"{route.src_lang}-{route.tgt_lang}") if calls else None
    t0 = time.perf_counter()
    theirs = hf_translate(out, lines, [b + 1 for b in budget.tolist()], direction=direction)
    seconds = time.perf_counter() - t0
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    near_ties = 0
    for i in differ:
        theirs_ids = translator.tokenizer.encode_tgt([theirs[i]])[0]
        margin = parting_gap(translator, sources[i], hyps[i], [*prefix, *theirs_ids])
        near_ties += margin <= NEAR_TIE
        print(
            f"{route.src_lang}-{route.tgt_lang} line {i + 1} (margin {margin:.2e}): "
            f"litmt={ours[i]!r} transformers={theirs[i]!r}",
            file=sys.stderr,
        )
    return {
        "lines": len(lines),
        "greedy_identical": len(lines) - len(differ),
        "greedy_near_ties": near_ties,
        "near_ties_within_cap": near_ties <= max_excused(len(lines)),
        "greedy_agreement": round(1 - len(differ) / len(lines), 4),
        "max_abs_logit_diff": max_logit_difference(out, translator, sources, hyps),
        "transformers_seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--out", type=Path, default=None, help="export directory (default: a temp one)")
    p.add_argument("--src", default="en", help="source language (file suffix)")
    p.add_argument("--split", default="test2016")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--round-trip", action="store_true")
    args = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # max_new_tokens with the config's max_length: expected
    lines = multi30k_lines(args.split, args.src, args.limit)
    tmp = tempfile.TemporaryDirectory()
    out = args.out or Path(tmp.name) / "hf"
    export_hf(args.ckpt, out, force=True)
    translator = Translator.from_checkpoint(args.ckpt, device="cpu")
    languages = translator.languages
    pairs: list[tuple[str | None, str | None]] = [
        (s, t) for s, t in languages.pairs() if s == args.src
    ] if languages.multilingual else [(None, None)]  # fmt: skip
    per = {f"{s}-{t}": direction_parity(translator, out, lines, (s, t)) for s, t in pairs}
    report: dict[str, object] = {
        "checkpoint": str(args.ckpt),
        "lines": len(lines) * len(pairs),  # every direction's
        "greedy_identical": sum(int(r["greedy_identical"]) for r in per.values()),
        "greedy_agreement": min(float(r["greedy_agreement"]) for r in per.values()),
        "max_abs_logit_diff": max(float(r["max_abs_logit_diff"]) for r in per.values()),
        "transformers_path": "pipeline" if has_translation_pipeline() else "generate",
    }
    if languages.multilingual:
        report["directions"] = per
    if args.round_trip:
        report.update(round_trip(args.ckpt, out, lines, pairs))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
