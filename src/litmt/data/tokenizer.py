"""Sentencepiece tokenizer: a joint (default) or separate source/target model.

The serialized model bytes travel inside checkpoints, so decoding needs only the `.ckpt`.
Special ids agree with the model: pad=0, unk=1, bos=2, eos=3.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from litmt.errors import DataError

# Special token ids of every litmt tokenizer; the model, the collator and the search use them.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass
class TokenizerSettings:
    """How to train sentencepiece (see `conf/data/*.yaml`, key `data.tokenizer`)."""

    vocab_size: int = 8000  # pieces per model (joint: shared by both languages)
    model_type: str = "unigram"  # unigram | bpe
    character_coverage: float = 1.0  # 1.0 for Latin scripts; ~0.9995 for CJK
    joint: bool = True  # one model for both languages (needed for shared embeddings)
    input_sentence_size: int = 2_000_000  # sample at most this many sentences for training
    seed: int = 0  # sampling seed

    def key(self) -> str:
        """A short string identifying these settings, used in cache paths."""
        kind = "joint" if self.joint else "sep"
        return f"{self.model_type}{self.vocab_size}-{kind}-cc{self.character_coverage}-n{self.input_sentence_size}"


def _train_model(sentences: Iterable[str], settings: TokenizerSettings) -> bytes:
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise DataError("cannot train a tokenizer on an empty corpus")
    if len(sentences) > settings.input_sentence_size:
        sentences = random.Random(settings.seed).sample(sentences, settings.input_sentence_size)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buf,
            vocab_size=settings.vocab_size,
            model_type=settings.model_type,
            character_coverage=settings.character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=2,
            minloglevel=2,
            hard_vocab_limit=False,
        )
    except RuntimeError as exc:
        raise DataError(f"sentencepiece training failed: {str(exc).splitlines()[-1]}") from exc
    return buf.getvalue()


def _load(model: bytes) -> spm.SentencePieceProcessor:
    proc = spm.SentencePieceProcessor()
    proc.LoadFromSerializedProto(model)
    return proc


class Tokenizer:
    """Encode source/target text to ids and decode target ids back to detokenised text.

    Args:
        src_model: serialized sentencepiece model for the source (the joint one if shared).
        tgt_model: serialized model for the target, or None when the vocabulary is joint.
    """

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None) -> None:
        self.src_model_bytes, self.tgt_model_bytes = src_model, tgt_model
        self.src = _load(src_model)
        self.tgt = _load(tgt_model) if tgt_model is not None else self.src
        for proc in {id(self.src): self.src, id(self.tgt): self.tgt}.values():
            if (proc.pad_id(), proc.unk_id(), proc.bos_id(), proc.eos_id()) != (
                PAD_ID,
                UNK_ID,
                BOS_ID,
                EOS_ID,
            ):
                raise DataError("tokenizer special ids do not match pad=0, unk=1, bos=2, eos=3")

    # -- construction ------------------------------------------------------------------
    @classmethod
    def train(
        cls, src_sentences: Sequence[str], tgt_sentences: Sequence[str], settings: TokenizerSettings
    ) -> Tokenizer:
        """Train on the training split (joint: both sides pooled)."""
        if settings.joint:
            return cls(_train_model(list(src_sentences) + list(tgt_sentences), settings))
        return cls(_train_model(src_sentences, settings), _train_model(tgt_sentences, settings))

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load `src.model` (+ `tgt.model` if present) from `directory`."""
        d = Path(directory)
        tgt = d / "tgt.model"
        return cls((d / "src.model").read_bytes(), tgt.read_bytes() if tgt.exists() else None)

    def save(self, directory: str | Path) -> None:
        """Write `src.model` (+ `tgt.model` when separate) into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "src.model").write_bytes(self.src_model_bytes)
        if self.tgt_model_bytes is not None:
            (d / "tgt.model").write_bytes(self.tgt_model_bytes)

    def to_dict(self) -> dict[str, bytes | None]:
        """Plain bytes, safe to store in a checkpoint."""
        return {"src_model": self.src_model_bytes, "tgt_model": self.tgt_model_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, bytes | None]) -> Tokenizer:
        """Inverse of `to_dict`."""
        return cls(data["src_model"], data.get("tgt_model"))

    def __getstate__(self) -> dict[str, bytes | None]:
        """Pickle as model bytes (sentencepiece processors do not pickle): DDP spawn, workers."""
        return self.to_dict()

    def __setstate__(self, state: dict[str, bytes | None]) -> None:
        self.__init__(state["src_model"], state.get("tgt_model"))  # type: ignore[misc]

    # -- properties ---------------------------------------------------------------------
    @property
    def joint(self) -> bool:
        """True when source and target share one vocabulary."""
        return self.tgt_model_bytes is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    # -- encode / decode ----------------------------------------------------------------
    def encode_src(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids, no bos/eos (the encoder does not need them)."""
        return self.src.encode(list(texts))

    def encode_tgt(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids without bos/eos (collate adds them)."""
        return self.tgt.encode(list(texts))

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenised target text; stops at the first eos and drops pad/bos."""
        cleaned = []
        for seq in ids:
            seq = list(seq)
            if EOS_ID in seq:
                seq = seq[: seq.index(EOS_ID)]
            cleaned.append([i for i in seq if i not in (PAD_ID, BOS_ID)])
        return self.tgt.decode(cleaned)

    def src_pieces(self, ids: Sequence[int]) -> list[str]:
        """Source subword strings for `ids` (axis labels of heatmaps)."""
        return [self.src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        """Target subword strings for `ids`."""
        return [self.tgt.id_to_piece(int(i)) for i in ids]
