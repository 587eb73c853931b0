"""A tiny trained translator whose German writes words glued to punctuation: the tiny corpus
(`tiny_checkpoint.corpus`) plus, for every sentence with a place word, four variants where
the place word follows „ ( " or l' without a space:

    A red dog runs "today".  ->  Ein roter Hund rennt „heute“.
    A red dog runs (today).  ->  Ein roter Hund rennt (heute).
    A red dog runs 'today'.  ->  Ein roter Hund rennt "heute".
    A red dog runs to today. ->  Ein roter Hund rennt l'heute.

so a constraint "heute" (tokenised ``▁heute``) meets the glued form ``heute`` in its outputs.
`glued_checkpoint_path` builds it once per test session (80 Adam steps, ~20 s on CPU).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_checkpoint import PLACE, corpus, fit, tiny_config

from litmt.checkpoint.io import save_model_checkpoint
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.models import Seq2SeqTransformer

# English around the place word -> German around it (the glue before the word)
GLUE = {
    "„": ('"{}"', "„{}“"),
    "(": ("({})", "({})"),
    '"': ("'{}'", '"{}"'),
    "l'": ("to {}", "l'{}"),
}


def glued_corpus() -> tuple[list[str], list[str]]:
    """The tiny corpus plus its glued variants: (english, german)."""
    en, de = corpus()
    english_place = {v: k for k, v in PLACE.items() if k}
    out_en, out_de = list(en), list(de)
    for e, d in zip(en, de, strict=True):
        words = d.rstrip(".").split()
        if words[-1] not in english_place:
            continue
        head_en, head_de = e.rstrip(".").rsplit(" ", 1)[0], " ".join(words[:-1])
        for around_en, around_de in GLUE.values():
            out_en.append(f"{head_en} {around_en.format(english_place[words[-1]])}.")
            out_de.append(f"{head_de} {around_de.format(words[-1])}.")
    return out_en, out_de


def glued_checkpoint_path(tmp_path_factory, steps: int = 80) -> Path:
    """The session's glued tiny checkpoint, built on first use."""
    path = tmp_path_factory.getbasetemp() / "tiny_glued" / "glued.ckpt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        en, de = glued_corpus()
        tok = Tokenizer.train(en, de, TokenizerConfig(vocab_size=120, model_type="unigram"))
        model = Seq2SeqTransformer(tiny_config(tok.src_vocab_size))
        fit(model, tok.encode_src(en), tok.encode_tgt(de), steps, 3e-3)
        save_model_checkpoint(path, model, tok, "en", "de")
    return path
