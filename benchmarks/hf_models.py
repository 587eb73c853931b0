"""Random-weight transformers Marian models with real sentencepiece tokenizers, saved the way
``save_pretrained`` saves them (the import/export tests and the benchmark build them)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch

EN_WORDS = [
    "a",
    "the",
    "man",
    "woman",
    "dog",
    "cat",
    "runs",
    "sits",
    "red",
    "blue",
    "big",
    "small",
    "house",
    "street",
    "park",
    "ball",
    "child",
    "plays",
    "in",
    "on",
    "with",
    "near",
    "water",
    "grass",
    "girl",
    "boy",
    "walks",
    "jumps",
    "green",
    "old",
    "young",
    "people",
    "two",
    "three",
]
DE_WORDS = [
    "ein",
    "der",
    "mann",
    "frau",
    "hund",
    "katze",
    "läuft",
    "sitzt",
    "rot",
    "blau",
    "groß",
    "klein",
    "haus",
    "straße",
    "park",
    "ball",
    "kind",
    "spielt",
    "in",
    "auf",
    "mit",
    "nahe",
    "wasser",
    "gras",
    "mädchen",
    "junge",
    "geht",
    "springt",
    "grün",
    "alt",
    "jung",
    "leute",
    "zwei",
    "drei",
]


def sentences(words: tuple[str, ...] | list[str], n: int, seed: int = 0) -> list[str]:
    """`n` random sentences of 2-12 of `words`."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(2, 13, (1,), generator=g))
        idx = torch.randint(0, len(words), (k,), generator=g).tolist()
        out.append(" ".join(words[i] for i in idx))
    return out


def train_spm(texts: list[str], vocab_size: int) -> bytes:
    """A unigram sentencepiece model with sentencepiece's default ids (as OPUS-MT's)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
        hard_vocab_limit=False,
        num_threads=1,
    )
    return buf.getvalue()


def marian_vocab(*models: bytes) -> dict[str, int]:
    """MarianTokenizer's vocab.json over the pieces of `models`: ``</s>`` 0, ``<unk>`` 1, the
    pieces, ``<pad>`` last (the OPUS-MT layout)."""
    pieces: list[str] = ["</s>", "<unk>"]
    for model in models:
        proc = spm.SentencePieceProcessor()
        proc.LoadFromSerializedProto(model)
        for i in range(proc.get_piece_size()):
            p = proc.id_to_piece(i)
            if not (proc.is_control(i) or proc.is_unknown(i)) and p not in pieces:
                pieces.append(p)
    pieces.append("<pad>")
    return {p: i for i, p in enumerate(pieces)}


def make_marian_dir(
    out: Path,
    *,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 64,
    activation: str = "swish",
    tie: bool = True,
    scale_embedding: bool = True,
    init_std: float = 0.15,
    eos_bias: float = 1.5,
    spm_size: int = 60,
    max_positions: int = 128,
    seed: int = 0,
    en_de: tuple[list[str], list[str]] | None = None,
) -> Path:
    """A random `MarianMTModel` + `MarianTokenizer` saved in `out` (returns `out`).

    Weights are drawn with std `init_std` (larger than transformers' 0.02, so that decoding
    decisions are not all near-ties); `final_logits_bias` is random with `eos_bias` added to
    eos, so outputs end before the length limit.
    """
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    en, de = en_de or (sentences(EN_WORDS, 400, seed), sentences(DE_WORDS, 400, seed + 1))
    src_model, tgt_model = train_spm(en, spm_size), train_spm(de, spm_size)
    vocab = marian_vocab(src_model, tgt_model)
    out.mkdir(parents=True, exist_ok=True)
    (out / "source.spm").write_bytes(src_model)
    (out / "target.spm").write_bytes(tgt_model)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    pad = len(vocab) - 1
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function=activation,
        scale_embedding=scale_embedding,
        tie_word_embeddings=tie,
        max_position_embeddings=max_positions,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        init_std=init_std,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # LayerNorms too: not the identity
            if "embed_positions" in name:  # static sinusoids, not saved
                continue
            p.normal_(0.0, init_std) if p.dim() > 1 else p.normal_(0.0, 0.1)
            if "layer_norm.weight" in name:
                p.add_(1.0)
        bias = torch.randn(1, len(vocab)) * 0.5
        bias[0, 0] += eos_bias
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(out)
    tok = MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
        source_lang="en", target_lang="de",
    )  # fmt: skip
    tok.save_pretrained(out)
    return out
