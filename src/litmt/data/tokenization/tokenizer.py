"""Sentencepiece tokenizer: a joint (default) or separate source/target model.

The serialized model bytes travel inside checkpoints, so decoding needs only the `.ckpt`.
Special ids agree with the model: pad=0, unk=1, bos=2, eos=3.

Tags: pieces declared as sentencepiece user-defined symbols (e.g. ``<BT>``, the tag of
back-translated sources) are never split. A source that starts with such a piece followed
by a space (``"<BT> a dog runs"``) encodes the tag as exactly one id, first, followed by the
ids of the rest; sentencepiece alone would put a separate ``▁`` piece before it. Target
text is encoded the same way (a multilingual model with ``data.tag_placement=target`` starts
its targets with the language token ``<2de>``), and target-language tokens (``<2xx>``,
`litmt.data.directions`) are dropped from decoded text.

A piece vocabulary (`litmt.data.tokenization.piece_vocab`, the one of a model imported from
transformers' Marian) gives the ids instead of the sentencepiece models, which then only
split text into pieces; such a tokenizer also ends every source with eos (``src_eos``), as
MarianTokenizer does. It has no tags.

Subword regularisation (`SubwordSampling`, Kudo 2018): `encode_src` / `encode_tgt` can sample
one segmentation among the possible ones instead of the best one (unigram: from the lattice
smoothed by alpha, or among its n best; bpe: BPE-dropout, each merge dropped with probability
alpha; the samplers and their seeds: `litmt.data.tokenization.segmentation`). Only the training split uses
it (`litmt.data.preparation.subword_sampling`); it is an encode-time choice, not another tokenizer, so it
is part of neither `TokenizerConfig.key` nor `Tokenizer.identity`.
"""

from __future__ import annotations

import io
import itertools
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from litmt.config import renamed_attribute
from litmt.data.directions import tag_language
from litmt.data.tokenization.config import TokenizerConfig
from litmt.data.tokenization.piece_vocab import PieceVocab
from litmt.data.tokenization.segmentation import SubwordSampling, encode_texts, model_proto
from litmt.errors import DataError
from litmt.runtime.threads import TOKENIZER_TRAIN_THREADS

# Special token ids of every litmt tokenizer; the model, the collator and the search use them.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
PIECES_FILE = "pieces.json"  # `Tokenizer.save`: the piece vocabulary and src_eos, if any


def _train_model(sentences: Iterable[str], settings: TokenizerConfig) -> bytes:
    sentences = [s for s in sentences if s.strip()]
    if 0 < settings.input_sentence_size < len(sentences):
        sentences = random.Random(settings.seed).sample(sentences, settings.input_sentence_size)
    return train_spm(sentences, settings)


def train_spm(sentences: Iterable[str], settings: TokenizerConfig) -> bytes:
    """A serialized sentencepiece model trained on `sentences` (already non-empty, sampled;
    `litmt.data.tokenization.training_sample` streams them from disk)."""
    it = iter(sentences)
    first = next(it, None)
    if first is None:
        raise DataError("cannot train a tokenizer on an empty corpus")
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], it),
            model_writer=buf,
            vocab_size=settings.vocab_size,
            model_type=settings.model_type,
            character_coverage=settings.character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=TOKENIZER_TRAIN_THREADS,  # fixed: the pieces depend on it
            minloglevel=2,
            hard_vocab_limit=False,
            user_defined_symbols=list(settings.user_defined_symbols),
        )
    except RuntimeError as exc:
        raise DataError(f"sentencepiece training failed: {str(exc).splitlines()[-1]}") from exc
    return buf.getvalue()


def _load(model: bytes) -> spm.SentencePieceProcessor:
    proc = spm.SentencePieceProcessor()
    try:
        proc.LoadFromSerializedProto(model)
    except RuntimeError as exc:
        raise DataError(f"not a sentencepiece model ({str(exc).splitlines()[0]})") from None
    return proc


def user_defined_pieces(model: bytes) -> dict[str, int]:
    """The user-defined symbols of a serialized sentencepiece model: piece -> id."""
    proto = model_proto(model)
    user = type(proto).SentencePiece.USER_DEFINED
    return {p.piece: i for i, p in enumerate(proto.pieces) if p.type == user}


def model_type(model: bytes) -> str:
    """The algorithm of a serialized sentencepiece model: unigram, bpe, word or char."""
    spec = model_proto(model).trainer_spec
    return type(spec).ModelType.Name(spec.model_type).lower()


def _encode_tagged(
    proc: spm.SentencePieceProcessor,
    tags: dict[str, int],
    texts: Sequence[str],
    sampling: SubwordSampling | None,
) -> list[list[int]]:
    """Ids of `texts`; each leading tag (a user-defined piece, then a space or the end; e.g.
    a language token then an extra source's ``<BT>``) is its one id, first, in order.
    `sampling`: a sampled segmentation of the rest (`litmt.data.tokenization.segmentation`); None = the
    best one."""
    texts = list(texts)
    if not tags:
        return encode_texts(proc, texts, sampling)
    found: list[list[int]] = [[] for _ in texts]
    for i, text in enumerate(texts):
        head, _, rest = text.partition(" ")
        while head in tags:
            found[i].append(tags[head])
            text = rest
            head, _, rest = text.partition(" ")
        texts[i] = text
    ids = encode_texts(proc, texts, sampling)
    return [[*t, *s] for t, s in zip(found, ids, strict=True)]


class Tokenizer:
    """Encode source/target text to ids and decode target ids back to detokenised text.

    Args:
        src_model: serialized sentencepiece model for the source (the joint one if shared).
        tgt_model: serialized model for the target, or None when the vocabulary is joint.
        vocab: the pieces by id, shared by source and target, when they give the ids
            instead of the sentencepiece models (see the module docstring); None: the
            sentencepiece ids.
        src_eos: end every source with eos.
    """

    def __init__(
        self,
        src_model: bytes,
        tgt_model: bytes | None = None,
        vocab: Sequence[str] | None = None,
        src_eos: bool = False,
    ) -> None:
        self.src_model_bytes, self.tgt_model_bytes = src_model, tgt_model
        self.src = _load(src_model)
        self.tgt = _load(tgt_model) if tgt_model is not None else self.src
        self.vocab = PieceVocab(vocab) if vocab is not None else None
        self.src_eos = bool(src_eos)
        # tag piece -> id (see module docstring); none with a piece vocabulary (imported models)
        self.src_tags = {} if self.vocab else user_defined_pieces(src_model)
        self.tgt_tags = (
            self.src_tags if tgt_model is None or self.vocab else user_defined_pieces(tgt_model)
        )
        # target-language tokens <2xx>: never part of the detokenised output
        self.lang_tag_ids = frozenset(i for p, i in self.tgt_tags.items() if tag_language(p))
        if self.vocab is not None:
            return
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
        cls,
        src_sentences: Iterable[str],
        tgt_sentences: Iterable[str],
        settings: TokenizerConfig,
        *,
        sampled: bool = False,
    ) -> Tokenizer:
        """Train on the training split (joint: both sides pooled).

        Args:
            sampled: the sentences are already the non-empty, bounded sample
                (`litmt.data.tokenization.training_sample`); joint: `src_sentences` is the pooled sample and
                `tgt_sentences` is ignored. Else they are sampled here, in memory.
        """
        if sampled:
            if settings.joint:
                return cls(train_spm(src_sentences, settings))
            return cls(train_spm(src_sentences, settings), train_spm(tgt_sentences, settings))
        if settings.joint:
            return cls(_train_model(list(src_sentences) + list(tgt_sentences), settings))
        return cls(_train_model(src_sentences, settings), _train_model(tgt_sentences, settings))

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """An existing tokenizer: a sentencepiece `.model` file (joint vocabulary) or a
        directory holding `src.model` (+ `tgt.model` for separate vocabularies).

        Raises:
            DataError: the path is missing or does not hold a sentencepiece model.
        """
        p = Path(path)
        if p.is_dir():
            if not (p / "src.model").is_file():
                raise DataError(
                    f"tokenizer directory {p} has no src.model; pass a sentencepiece .model "
                    f"file or a directory with src.model (+ tgt.model)"
                )
            where, tok = p, None
        elif p.is_file():
            where, tok = p, p.read_bytes()
        else:
            raise DataError(f"tokenizer model {p} does not exist (data.tokenizer.model)")
        try:
            return cls.load(where) if tok is None else cls(tok)
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load `src.model` (+ `tgt.model`, + `PIECES_FILE` if present) from `directory`."""
        d = Path(directory)
        tgt, pieces = d / "tgt.model", d / PIECES_FILE
        extra = json.loads(pieces.read_text(encoding="utf-8")) if pieces.exists() else {}
        return cls(
            (d / "src.model").read_bytes(),
            tgt.read_bytes() if tgt.exists() else None,
            extra.get("pieces"),
            extra.get("src_eos", False),
        )

    def save(self, directory: str | Path) -> None:
        """Write `src.model` (+ `tgt.model` when separate, + the piece vocabulary and
        ``src_eos`` as `PIECES_FILE`) into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "src.model").write_bytes(self.src_model_bytes)
        if self.tgt_model_bytes is not None:
            (d / "tgt.model").write_bytes(self.tgt_model_bytes)
        if self.vocab is not None or self.src_eos:
            pieces = None if self.vocab is None else self.vocab.pieces
            data = {"pieces": pieces, "src_eos": self.src_eos}
            (d / PIECES_FILE).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    def to_dict(self) -> dict[str, Any]:
        """Plain bytes (and the piece list), safe to store in a checkpoint."""
        out: dict[str, Any] = {"src_model": self.src_model_bytes, "tgt_model": self.tgt_model_bytes}
        if self.vocab is not None or self.src_eos:  # only then: older checkpoints compare equal
            out["vocab"] = None if self.vocab is None else list(self.vocab.pieces)
            out["src_eos"] = self.src_eos
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        """Inverse of `to_dict`."""
        return cls(
            data["src_model"], data.get("tgt_model"), data.get("vocab"), data.get("src_eos", False)
        )

    def identity(self) -> tuple[Any, ...]:
        """What defines the ids (cache keys): the model bytes (+ the piece list and src_eos)."""
        return tuple(self.to_dict().values())

    def __getstate__(self) -> dict[str, Any]:
        """Pickle as model bytes (sentencepiece processors do not pickle): DDP spawn, workers."""
        return self.to_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["src_model"],
            state.get("tgt_model"),
            state.get("vocab"),
            state.get("src_eos", False),
        )

    # -- properties ---------------------------------------------------------------------
    @property
    def joint(self) -> bool:
        """True when source and target share one vocabulary."""
        return self.tgt_model_bytes is None or self.vocab is not None

    @property
    def model_types(self) -> tuple[str, ...]:
        """The algorithm (`model_type`) of the source model, then of the target model if
        separate."""
        models = [self.src_model_bytes]
        if self.tgt_model_bytes is not None:
            models.append(self.tgt_model_bytes)
        return tuple(model_type(m) for m in models)

    @property
    def src_vocab_size(self) -> int:
        return len(self.vocab) if self.vocab is not None else self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.vocab) if self.vocab is not None else self.tgt.get_piece_size()

    # -- encode / decode ----------------------------------------------------------------
    def encode_src(
        self, texts: Sequence[str], sampling: SubwordSampling | None = None
    ) -> list[list[int]]:
        """Source ids, no bos/eos (the encoder does not need them).

        A leading tag (a user-defined piece, then a space or the end) becomes its one id.
        `sampling`: sample the segmentation (the training split only); None = the best one.
        """
        texts = list(texts)
        if self.vocab is not None:
            ids = self.vocab.encode(self.src, texts, sampling)
        else:
            ids = _encode_tagged(self.src, self.src_tags, texts, sampling)
        return [[*s, EOS_ID] for s in ids] if self.src_eos else ids

    def encode_tgt(
        self, texts: Sequence[str], sampling: SubwordSampling | None = None
    ) -> list[list[int]]:
        """Target ids without bos/eos (collate adds them); a leading tag is one id and
        `sampling` samples, as in `encode_src`."""
        if self.vocab is not None:
            return self.vocab.encode(self.tgt, list(texts), sampling)
        return _encode_tagged(self.tgt, self.tgt_tags, texts, sampling)

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenised target text; stops at the first eos and drops pad/bos."""
        cleaned = []
        for seq in ids:
            seq = list(seq)
            if EOS_ID in seq:
                seq = seq[: seq.index(EOS_ID)]
            drop = self.lang_tag_ids
            cleaned.append([i for i in seq if i not in (PAD_ID, BOS_ID) and i not in drop])
        if self.vocab is not None:
            return self.vocab.decode(self.tgt, cleaned)
        return self.tgt.decode(cleaned)

    def src_pieces(self, ids: Sequence[int]) -> list[str]:
        """Source subword strings for `ids` (axis labels of heatmaps)."""
        if self.vocab is not None:
            return [self.vocab.pieces[int(i)] for i in ids]
        return [self.src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        """Target subword strings for `ids`."""
        if self.vocab is not None:
            return [self.vocab.pieces[int(i)] for i in ids]
        return [self.tgt.id_to_piece(int(i)) for i in ids]


def __getattr__(name: str) -> Any:
    """Old names of this module's classes, kept one release (`litmt.config.renamed_attribute`)."""
    return renamed_attribute(__name__, name, {"TokenizerSettings": "TokenizerConfig"}, globals())
