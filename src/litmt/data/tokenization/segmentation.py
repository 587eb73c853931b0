"""Encoding text with a sentencepiece model: the best segmentation, or a sampled one
(subword regularisation, Kudo 2018; BPE-dropout), seeded so that a seed gives one result.

Two samplers, by `SubwordSampling.nbest`:

- ``nbest > 1`` (unigram): litmt's own. It asks sentencepiece for the `nbest` best
  segmentations and their scores (``nbest_encode``, deterministic) and draws one with
  probability proportional to ``exp(alpha * score)``: the rule of sentencepiece's own
  ``nbest_size > 1`` branch (``SentencePieceProcessor::SampleEncode`` in
  ``src/sentencepiece_processor.cc``, 0.2.3). The draw comes from a numpy PCG64 generator
  seeded with `SubwordSampling.seed`, so the same seed gives the same segmentation in every
  process, on every rank and after a resume. A segmentation's score is the sum of its
  lattice nodes' scores (``Lattice::NBest`` in ``src/unigram_model.cc``); when every piece of
  the n best is a normal piece that is its pieces' scores, so litmt sums them from the ids
  (`_Scores`) and asks sentencepiece for the scored n-best proto (about 2x slower) only when a
  segmentation holds an unknown or user-defined piece, whose node scores differ.
- ``nbest == -1`` (unigram: all segmentations, from the lattice) and BPE-dropout:
  sentencepiece's own sampler, seeded with ``sentencepiece.set_random_generator_seed``. In
  sentencepiece 0.2.3 that seeds an ``absl::BitGen`` (``src/util.cc``,
  ``SetRandomGeneratorSeed``), and Abseil mixes the seed with per-process entropy: "Constructing
  two absl::BitGens with the same seed sequence in the same binary will produce the same
  sequence of variates within the same binary, but need not do so across multiple binary
  invocations" (``absl/random/random.h``). So these samples repeat within one process (and in
  its forked DataLoader workers), not in another process.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sentencepiece as spm


@dataclass(frozen=True)
class SubwordSampling:
    """Sample a segmentation when encoding.

    Attributes:
        alpha: unigram: the smoothing exponent of the segmentation probabilities (small =
            closer to uniform); bpe: the probability of dropping each merge (BPE-dropout).
        nbest: unigram: sample among the `nbest` best segmentations (-1 = all of them, from
            the lattice; 1 = the best one: no sampling). BPE-dropout ignores it (keep -1).
        seed: the seed of one encode call's draws (None: unseeded). The texts of one call
            are drawn in order from one generator.
    """

    alpha: float
    nbest: int = -1
    seed: int | None = None

    @property
    def reproducible(self) -> bool:
        """Whether a seed gives the same segmentation in every process (litmt's n-best
        sampler), not only within one (sentencepiece's generator)."""
        return self.nbest > 1


def encode_texts(
    proc: spm.SentencePieceProcessor,
    texts: Sequence[str],
    sampling: SubwordSampling | None = None,
    out_type: type = int,
) -> list[list[Any]]:
    """Ids (``out_type=int``) or pieces (``str``) of each text: the best segmentation
    (`sampling` None or ``nbest == 1``), else a sampled one (see the module docstring)."""
    texts = list(texts)
    if sampling is None or sampling.nbest == 1:
        return proc.encode(texts, out_type=out_type)
    if sampling.nbest > 1:
        rng = np.random.default_rng(sampling.seed)
        return [_sample_nbest(proc, text, sampling, rng, out_type) for text in texts]
    if sampling.seed is not None:
        spm.set_random_generator_seed(sampling.seed)
    # one thread: the texts are drawn in order from the generator just seeded
    return proc.encode(
        texts, out_type=out_type, enable_sampling=True, alpha=sampling.alpha,
        nbest_size=sampling.nbest, num_threads=1,
    )  # fmt: skip


def nbest_probs(scores: Sequence[float], alpha: float) -> np.ndarray:
    """(n,) probabilities of n segmentations with log-scores `scores`: softmax(alpha * score),
    as sentencepiece's n-best branch computes them (float64)."""
    logits = alpha * np.asarray(scores, dtype=np.float64)
    if not np.isfinite(logits).any():
        return np.full(len(logits), 1.0 / len(logits))
    logits = np.where(np.isfinite(logits), logits, -math.inf)
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def model_proto(model: bytes) -> Any:
    """The `ModelProto` of a serialized sentencepiece model (the one parser: the tokenizer,
    which imports this module, reads its user-defined pieces and model type with it)."""
    from sentencepiece import sentencepiece_model_pb2  # needs protobuf (pyproject dependency)

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return proto


class _Scores:
    """The piece scores of a unigram model by id (float32, as sentencepiece keeps them) and
    which ids are normal pieces (whose lattice node score is their piece score)."""

    def __init__(self, proc: spm.SentencePieceProcessor) -> None:
        proto = model_proto(proc.serialized_model_proto())
        normal = proto.SentencePiece.NORMAL
        self.score = np.array([p.score for p in proto.pieces], dtype=np.float32)
        self.normal = np.array([p.type == normal for p in proto.pieces], dtype=bool)

    def of(self, segmentations: list[list[int]]) -> np.ndarray | None:
        """(n,) scores of the segmentations, or None when one holds a piece that is not
        normal or is empty (then sentencepiece's proto gives the scores)."""
        flat = np.fromiter((i for seg in segmentations for i in seg), dtype=np.int64)
        if flat.size and not self.normal[flat].all():
            return None
        lengths = np.fromiter(map(len, segmentations), dtype=np.int64, count=len(segmentations))
        if not lengths.all():  # an empty segmentation: left to the proto as well
            return None
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        return np.add.reduceat(self.score[flat].astype(np.float64), starts)


_SCORES: weakref.WeakKeyDictionary[spm.SentencePieceProcessor, _Scores] = (
    weakref.WeakKeyDictionary()
)


def _scores(proc: spm.SentencePieceProcessor) -> _Scores:
    found = _SCORES.get(proc)
    if found is None:
        found = _SCORES[proc] = _Scores(proc)
    return found


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with probabilities `probs` (inverse CDF of one uniform draw)."""
    cdf = np.cumsum(probs)
    k = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(k, len(probs) - 1)


def _sample_nbest(
    proc: spm.SentencePieceProcessor,
    text: str,
    sampling: SubwordSampling,
    rng: np.random.Generator,
    out_type: type,
) -> list[Any]:
    """One segmentation of `text` drawn from its `sampling.nbest` best by `nbest_probs`."""
    ids = proc.nbest_encode(text, nbest_size=sampling.nbest, out_type=int)
    if len(ids) <= 1:  # one segmentation (or an empty text): the best one, no draw
        return proc.encode(text, out_type=out_type)
    scores = _scores(proc).of(ids)
    if scores is not None:
        return _out(proc, ids[_draw(nbest_probs(scores, sampling.alpha), rng)], out_type)
    # an unknown or user-defined piece: its node score (and surface) from sentencepiece
    nbests = proc.nbest_encode(text, nbest_size=sampling.nbest, out_type="proto").nbests
    pick = nbests[_draw(nbest_probs([n.score for n in nbests], sampling.alpha), rng)]
    return [p.id if out_type is int else p.piece for p in pick.pieces]


def _out(proc: spm.SentencePieceProcessor, ids: list[int], out_type: type) -> list[Any]:
    """`ids` of normal pieces, as ids or as pieces (a normal piece is its own surface)."""
    return list(ids) if out_type is int else [proc.id_to_piece(i) for i in ids]
