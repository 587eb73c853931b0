"""Tiny synthetic parallel corpora that the data tests write themselves."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.hf_models import DE_WORDS, EN_WORDS

# the first 16 words of the Marian test models' word lists (benchmarks/hf_models.py)
EN, DE = EN_WORDS[:16], DE_WORDS[:16]


def make_pairs(n: int, seed: int = 0, max_words: int = 12) -> tuple[list[str], list[str]]:
    """`n` aligned synthetic sentence pairs (word-by-word 'translations' of varying length)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        k = rng.randint(1, max_words)
        ids = [rng.randrange(len(EN)) for _ in range(k)]
        src.append(" ".join(EN[i] for i in ids))
        tgt.append(" ".join(DE[i] for i in ids))
    return src, tgt


def write_text_corpus(
    root: Path, sizes: dict[str, int] | None = None, langs: tuple[str, str] = ("en", "de")
) -> Path:
    """`{root}/{split}.{lang}` files (fairseq convention); returns `root`."""
    sizes = sizes or {"train": 300, "valid": 40, "test": 30}
    root.mkdir(parents=True, exist_ok=True)
    for k, (split, n) in enumerate(sizes.items()):
        src, tgt = make_pairs(n, seed=k)
        (root / f"{split}.{langs[0]}").write_text("\n".join(src) + "\n", encoding="utf-8")
        (root / f"{split}.{langs[1]}").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return root


def write_splits(root: Path, en: list[str], de: list[str], rows: dict[str, slice]) -> Path:
    """`{root}/{split}.en` and `.de` holding the lines `rows[split]` of the aligned `en`/`de`
    (e.g. the corpus a tiny checkpoint was trained on); returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for split, sl in rows.items():
        (root / f"{split}.en").write_text("\n".join(en[sl]) + "\n", encoding="utf-8")
        (root / f"{split}.de").write_text("\n".join(de[sl]) + "\n", encoding="utf-8")
    return root


TINY_TOKENIZER = {"vocab_size": 60, "model_type": "unigram", "character_coverage": 1.0}


FR = {"ein": "un", "der": "le", "mann": "homme", "hund": "chien"}


def write_multi(root: Path, sizes: dict[str, int]) -> Path:
    """`{root}/{split}.{en,de,fr}`, line-aligned across the three languages."""
    root.mkdir(parents=True, exist_ok=True)
    for k, (split, n) in enumerate(sizes.items()):
        en, de = make_pairs(n, seed=k, max_words=6)
        fr = [" ".join(FR.get(w, w + "e") for w in s.split()) for s in de]
        for lang, lines in (("en", en), ("de", de), ("fr", fr)):
            (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
