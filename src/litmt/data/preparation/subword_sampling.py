"""Subword regularisation of the training split (`data.tokenizer.sampling_alpha`, Kudo 2018;
BPE-dropout for bpe models): every epoch, each training example is encoded again from its raw
text with a sampled segmentation.

`SampledPairs` wraps the training pairs the sampler reads (the prepared cache, or its
resampled view under `data.directions`): it keeps their order, `index` and stored lengths, and
replaces each item's ids by `Tokenizer.encode_src` / `encode_tgt` of the pair's raw text with
`SubwordSampling`. The raw text is the one preparation tokenised: the same stream
(`litmt.data.corpora.interface.Corpora.chunks`: tags of `extra_train` and of `directions`, on either side,
and `limit` included) written once to a memory-mapped text cache (`litmt.data.preparation.memmap.TextPairs`)
and looked up by the example's index. So with the best segmentation (``sampling_nbest=1``)
every item equals the cached one, and a sampled item differs only in its segmentation.

Lengths: a sampled segmentation is usually longer than the stored (best) one: on Multi30k
x1.04-1.09 the tokens at unigram alpha 0.5 or nbest 64, x1.35-1.97 at unigram alpha 0.2-0.1
(nbest -1), x1.4 at bpe alpha 0.1. Batches planned on the stored lengths then exceeded
`data.max_tokens` by about that ratio (worst batch 1.4x to 3.6x), so the datamodule plans them
on the stored lengths x the ratio measured at setup (`plan_on_sampled_lengths`), with fewer
sentences per batch (more steps per epoch). A sampled side must also fit the length its batch
was planned on (stored x ratio, rounded up, at most `data.filter.max_len`): a longer draw is
drawn again (`DRAWS` in all, each with its own seed), and a side with no draw that fits keeps
its cached (best) ids, counted in `fallbacks` (logged once per worker and epoch). So no batch
exceeds `data.max_tokens`; the price is that segmentations much longer than the average are
not sampled.

Reproducibility: example `pos` of the epoch's training dataset is sampled with a seed hashed
from (data.seed, epoch, pos, side, draw) (`item_seed`). With ``sampling_nbest > 1`` (unigram)
litmt draws among sentencepiece's n best segmentations itself, from a numpy generator with that
seed, so the segmentations depend only on the seed, the epoch and the dataset: the same in a
rerun, after a mid-epoch resume and on every DDP rank. With ``sampling_nbest=-1`` and with
BPE-dropout, sentencepiece samples with its own generator, and in sentencepiece 0.2.3 a seed
repeats a sample only within one process and its forked workers, not in another process
(`litmt.data.tokenization.segmentation` gives the cause); the setup log says which of the two a run has.
A repeated example (directions with T != 1) gets a new segmentation at each position.

The epoch reaches the DataLoader workers when they start (`set_epoch`, called by
`litmt.data.batching.loader.ResumableDataLoader` before each iteration), so the train loader does not
keep its workers between epochs when sampling is on.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import struct
from dataclasses import replace

import numpy as np
import sentencepiece as spm

from litmt.data.batching.collate import Example, TokenizedPairs
from litmt.data.preparation.memmap import TextPairs
from litmt.data.tokenization.segmentation import SubwordSampling
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

_SAMPLED_TYPES = ("unigram", "bpe")  # sentencepiece samples only these
DRAWS = 4  # sampled segmentations tried per side before a side keeps its best one


def check_sampling(tok: Tokenizer, sampling: SubwordSampling) -> None:
    """Refuse subword sampling the tokenizer's models cannot do.

    Raises:
        ConfigError: a word or char model, or ``sampling_nbest`` set for a bpe model.
    """
    for kind in tok.model_types:
        if kind not in _SAMPLED_TYPES:
            raise ConfigError(
                f"data.tokenizer.sampling_alpha needs a unigram or bpe sentencepiece model, "
                f"this tokenizer's is {kind}; set data.tokenizer.sampling_alpha=null"
            )
        if kind == "bpe" and sampling.nbest != -1:
            raise ConfigError(
                f"data.tokenizer.sampling_nbest={sampling.nbest} applies to unigram models "
                f"only (BPE-dropout drops merges with probability sampling_alpha); leave "
                f"sampling_nbest at -1 with a bpe model"
            )


def describe(tok: Tokenizer, sampling: SubwordSampling) -> str:
    """One log line: what is sampled, and where."""
    if set(tok.model_types) == {"bpe"}:
        how = f"BPE-dropout, each merge dropped with probability alpha={sampling.alpha:g}"
    else:
        among = {-1: "all segmentations", 1: "the best one only: no sampling"}
        how = (
            f"unigram, smoothing alpha={sampling.alpha:g}, nbest={sampling.nbest} "
            f"({among.get(sampling.nbest, f'the {sampling.nbest} best')})"
        )
    if sampling.reproducible:
        seeded = "litmt's seeded sampler: the same segmentations in every process"
    else:
        seeded = (
            "sentencepiece's generator: reproducible within one process only, not across "
            "runs, resumes or DDP ranks; sampling_nbest=64 gives litmt's seeded sampler"
        )
    return (
        f"subword sampling on the train split only ({how}; {seeded}); valid/test, decoding "
        f"and exports keep the best segmentation"
    )


def item_seed(seed: int, epoch: int, pos: int, side: int, draw: int = 0) -> int:
    """The seed of the sampler for one side (0 = source, 1 = target) of example `pos` in
    `epoch`, draw `draw` (0 first): a hash, below 2**32 - 1 (which sentencepiece reads as
    "seed from the clock")."""
    digest = hashlib.blake2b(
        struct.pack("<4q", seed, epoch, pos, side + 2 * draw), digest_size=4
    ).digest()
    return int.from_bytes(digest, "little") % 0xFFFFFFFF


class SampledPairs(TokenizedPairs):
    """`pairs` with each item encoded again from its raw text, a sampled segmentation.

    Args:
        pairs: the training pairs (their order, `indices` and stored lengths are kept).
        texts: the raw pairs of the split, by example index (the text preparation read).
        tokenizer: the tokenizer that prepared `pairs`.
        sampling: alpha and nbest.
        seed: `data.seed`.
        max_len: longest sampled side kept (`data.filter.max_len`).

    A sampled side longer than the length batches were planned on (`planned_len`) is drawn
    again, up to `DRAWS` times; then it keeps its cached ids (`fallbacks` counts those sides,
    `sides` all sides encoded by this object).
    """

    def __init__(
        self,
        pairs: TokenizedPairs,
        texts: TextPairs,
        tokenizer: Tokenizer,
        sampling: SubwordSampling,
        *,
        seed: int,
        max_len: int,
    ) -> None:
        self.pairs, self.texts, self.tokenizer, self.sampling = pairs, texts, tokenizer, sampling
        self.indices = pairs.indices
        self.max_src_len, self.max_tgt_len = pairs.max_src_len, pairs.max_tgt_len
        self.seed, self.max_len, self.epoch = int(seed), int(max_len), 0
        self.plan_ratio = 1.0  # stored lengths x this = the lengths batches are planned on
        self.fallbacks = self.sides = 0
        self._warned = False
        self._check_reseeding()

    def plan_on_sampled_lengths(self, n: int = 256) -> float:
        """Plan batches on the stored lengths scaled by the measured sampled/stored ratio
        (`length_ratio`, rounded up, capped at `max_len`), so that a batch's sampled tokens
        stay near `data.max_tokens` on average instead of exceeding it by that ratio.

        Returns:
            the ratio used (1.0: sampled items are not longer).
        """
        ratio, _ = self.length_ratio(n)
        self.plan_ratio = max(1.0, ratio)
        return self.plan_ratio

    def planned_len(self, stored: int) -> int:
        """The length a side of `stored` tokens (bos/eos not counted) is planned on: the
        longest sampled side it may take (`_planned` for one length)."""
        return int(self._planned(np.array([stored]), 0)[0])

    def fallback_rate(self, n: int = 256) -> float:
        """The fraction of sides of `n` evenly spaced examples that keep their best
        segmentation (no draw fitted their planned length), at the current `plan_ratio`."""
        fallbacks, sides = self.fallbacks, self.sides
        self.fallbacks = self.sides = 0
        for pos in self._positions(n):
            self[pos]
        rate = self.fallbacks / max(self.sides, 1)
        self.fallbacks, self.sides = fallbacks, sides
        return rate

    def _planned(self, lengths: np.ndarray, extra: int) -> np.ndarray:
        if self.plan_ratio == 1.0:
            return lengths
        body = np.ceil((lengths.astype(np.float64) - extra) * self.plan_ratio)
        return (np.minimum(body, self.max_len) + extra).astype(lengths.dtype)

    def set_epoch(self, epoch: int) -> None:
        """Sample the segmentations of `epoch` (before the DataLoader starts its workers),
        of `pairs`' examples of `epoch` when they change per epoch (`ResampledPairs`)."""
        self.epoch = int(epoch)
        if hasattr(self.pairs, "set_epoch"):
            self.pairs.set_epoch(self.epoch)
            self.indices = self.pairs.indices

    @property
    def redrawn_per_epoch(self) -> bool:
        """Whether `pairs`' examples change per epoch (`litmt.data.corpora.multi.ResampledPairs`)."""
        return bool(getattr(self.pairs, "redrawn_per_epoch", False))

    def at_epoch(self, epoch: int) -> SampledPairs:
        """A copy serving `epoch` (what the batch sampler plans that epoch's lengths on)."""
        out = copy.copy(self)
        if self.redrawn_per_epoch:
            out.pairs = self.pairs.at_epoch(epoch)
            out.indices = out.pairs.indices
        out.epoch = int(epoch)
        return out

    def __len__(self) -> int:
        return len(self.pairs)

    def src_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) source lengths batches are planned on: the stored ones (the best
        segmentation's) x `plan_ratio`."""
        return self._planned(self.pairs.src_lengths(start, stop), 0)

    def tgt_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) target lengths + 1 batches are planned on (stored x `plan_ratio`, + 1)."""
        return self._planned(self.pairs.tgt_lengths(start, stop), 1)

    def _encode(self, text: str, side: int, pos: int, draw: int = 0) -> list[int]:
        sampling = replace(self.sampling, seed=item_seed(self.seed, self.epoch, pos, side, draw))
        encode = self.tokenizer.encode_src if side == 0 else self.tokenizer.encode_tgt
        return encode([text], sampling)[0]

    def _sample(self, pos: int, planned: bool) -> Example:
        """Example `pos` with sampled sides; `planned`: each side fits its `planned_len`
        (else only `max_len`), drawn up to `DRAWS` times, else its cached ids."""
        index, src, tgt = self.pairs[pos]  # the cached ids: the fallback of a too-long side
        texts = self.texts[index]
        out = []
        for side, cached, cap in ((0, src, self.max_src_len), (1, tgt, self.max_tgt_len)):
            limit = self.planned_len(len(cached)) if planned else self.max_len
            for draw in range(DRAWS if planned else 1):
                ids = self._encode(texts[side], side, pos, draw)
                arr = np.asarray(ids, dtype=cached.dtype)
                arr = arr if cap is None else arr[:cap]
                if len(ids) <= self.max_len and len(arr) <= limit:
                    break
            else:
                self.fallbacks += 1
                if not self._warned:  # expected now and then: the setup log gives the rate
                    log.info(
                        "subword sampling: no sampled segmentation of example %d (side %d) "
                        "fitted the %d tokens its batch was planned on in %d draws; such sides "
                        "keep their best segmentation (logged once per worker and epoch)",
                        index, side, limit, DRAWS if planned else 1,
                    )  # fmt: skip
                    self._warned = True
                arr = cached
            self.sides += 1
            out.append(arr)
        return index, out[0], out[1]

    def __getitem__(self, pos: int) -> Example:
        """Example `pos` of this epoch: each side a sampled segmentation that fits the
        length its batch was planned on, or its cached ids."""
        return self._sample(pos, planned=True)

    def first_draw(self, pos: int) -> Example:
        """Example `pos` with each side's first sampled draw, cut only to `max_len` (never
        fitted to its planned length): what `length_ratio` measures, and what batches held
        before draws were fitted (`reports/subword_batches.py` compares the two)."""
        return self._sample(pos, planned=False)

    def _positions(self, n: int) -> list[int]:
        count = min(n, len(self))
        return np.unique(np.linspace(0, len(self) - 1, count).astype(np.int64)).tolist()

    def length_ratio(self, n: int = 256) -> tuple[float, int]:
        """(sampled / stored tokens, both sides, over `n` evenly spaced examples of this
        epoch, first draws up to `max_len`; how many examples): how much longer sampled items
        are."""
        positions = self._positions(n)
        stored = sampled = 0
        for pos in positions:
            _, src, tgt = self.pairs[pos]
            _, s, t = self.first_draw(pos)
            stored, sampled = stored + len(src) + len(tgt), sampled + len(s) + len(t)
        return sampled / max(stored, 1), len(positions)

    def _check_reseeding(self) -> None:
        """Warn when a seed does not repeat a segmentation within this process (with
        sentencepiece's generator: a sentencepiece whose generator ignores later seeds):
        then nothing is reproducible."""
        if not len(self.pairs):
            return
        text = self.texts[int(self.indices[0])][0] * 4
        if self._encode(text, 0, 0) != self._encode(text, 0, 0):
            log.warning(
                "subword sampling: sentencepiece %s does not repeat a segmentation for the "
                "same seed; the sampled segmentations are not reproducible",
                spm.__version__,
            )
