"""The splits of a multilingual corpus (`data.directions`): one `ParallelCorpus` per
direction over the same files, concatenated in config order and tagged with the target
language (`litmt.data.directions`), and the temperature-sampled training examples.

A direction's training split is its corpus's, followed by the `data.extra_train` sources
whose `direction` names it (`litmt.data.sources`: their own tags first, then the language
tag), so temperature sampling counts them in that direction's size.

`MultiCorpus` streams, loads, counts and fingerprints a split like `litmt.data.streams` and
`litmt.data.sources` do for one direction; `ResampledPairs` is a view of the prepared
training pairs with each direction repeated or subsampled (`sampled_positions`), which the
token-budget sampler reads like any `TokenizedPairs` (no copy of the token ids).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import datasets
import numpy as np

from litmt.data.collate import Example, TokenizedPairs
from litmt.data.corpus import ParallelCorpus, short_hash
from litmt.data.directions import Direction, direction_of, sampled_positions
from litmt.data.sources import TrainSource, load_split, split_fingerprint
from litmt.data.streams import Chunk, count_pairs, pair_chunks

log = logging.getLogger(__name__)


def _tag(tag: str, texts: list[str]) -> list[str]:
    # empty lines stay empty, so that the training filter still drops them
    return [f"{tag} {t}" if t else "" for t in texts]


@dataclass
class MultiCorpus:
    """Every direction's corpus, tagged by `placement` (``source`` or ``target``)."""

    directions: list[Direction]
    corpora: list[ParallelCorpus]  # one per direction, same order
    placement: str = "source"
    extra: list[TrainSource] = field(default_factory=list)  # each with its direction index

    def _extra(self, k: int) -> list[TrainSource]:
        """The extra training sources of direction `k`, in config order."""
        return [s for s in self.extra if s.direction == k]

    def fingerprint(self, split: str) -> str:
        """A cache key of every direction's content (extra sources included) and the tag
        placement."""
        parts = [
            (d.name, split_fingerprint(c, self._extra(k), split))
            for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True))
        ]
        return short_hash("multi", self.placement, *parts)

    def _tagged(self, d: Direction, src: list[str], tgt: list[str]) -> Chunk:
        if self.placement == "source":
            return _tag(d.tag, src), tgt
        return src, _tag(d.tag, tgt)

    def chunks(self, split: str, limit: int | None = None) -> Iterator[Chunk]:
        """The tagged pairs of `split`, direction after direction (`limit`: per direction,
        extra sources included)."""
        for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True)):
            for src, tgt in pair_chunks(c, self._extra(k), split, limit=limit):
                yield self._tagged(d, src, tgt)

    def sizes(self, split: str, limit: int | None = None) -> list[int]:
        """Pairs per direction in `split` (before filtering; `limit` per direction)."""
        out = []
        for k, c in enumerate(self.corpora):
            n = count_pairs(c, self._extra(k), split)
            if n is None:  # hub tables: count by loading (Arrow, memory-mapped)
                n = len(load_split(c, self._extra(k), split))
            out.append(n if limit is None else min(n, limit))
        return out

    def offsets(self, split: str, limit: int | None = None) -> list[int]:
        """(D+1,) start of each direction's example indices in `split`, then the total."""
        return [0, *np.cumsum(self.sizes(split, limit)).tolist()]

    def load(self, split: str, limit: int | None = None) -> datasets.Dataset:
        """The split's text (`src`, `tgt`): references keep their plain target text; with
        ``source`` placement, sources carry their tag (what the model reads)."""
        parts = []
        for k, (d, c) in enumerate(zip(self.directions, self.corpora, strict=True)):
            ds = load_split(c, self._extra(k), split)
            if limit is not None:
                ds = ds.select(range(min(limit, len(ds))))
            src = [s or "" for s in ds["src"]]
            if self.placement == "source":
                src = _tag(d.tag, src)
            parts.append(datasets.Dataset.from_dict({"src": src, "tgt": list(ds["tgt"])}))
        return datasets.concatenate_datasets(parts)


class ResampledPairs(TokenizedPairs):
    """`base`'s examples at `positions` (repeats allowed), sharing its arrays.

    Args:
        base: the prepared training pairs.
        positions: (M,) positions into `base`.
    """

    def __init__(self, base: TokenizedPairs, positions: np.ndarray) -> None:
        self.__dict__.update(base.__dict__)
        self.base, self.positions = base, np.asarray(positions, dtype=np.int64)
        self.indices = base.indices[self.positions]  # (M,)

    def src_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) source tensor lengths of positions start:stop (as `TokenizedPairs`)."""
        return self.base.src_lengths_at(self.positions[start:stop])  # not all of base's

    def tgt_lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n,) target tensor lengths of positions start:stop (as `TokenizedPairs`)."""
        return self.base.tgt_lengths_at(self.positions[start:stop])

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, pos: int) -> Example:
        return self.base[int(self.positions[pos])]


def resample(
    pairs: TokenizedPairs,
    offsets: list[int],
    directions: list[Direction],
    temperature: float,
    seed: int,
) -> TokenizedPairs:
    """Temperature-sampled training pairs (`litmt.data.directions.sampled_positions`); at
    T=1 `pairs` itself (the corpus proportions)."""
    which = direction_of(offsets, pairs.indices)  # (N,) direction of each kept pair
    groups = [np.flatnonzero(which == k) for k in range(len(directions))]
    if temperature == 1.0:
        counts = [len(g) for g in groups]
        log.info(
            "directions (T=1, proportional): %s",
            ", ".join(f"{d.name} {n}" for d, n in zip(directions, counts, strict=True)),
        )
        return pairs
    positions, counts = sampled_positions(groups, temperature, seed)
    log.info(
        "directions (T=%g): %s",
        temperature,
        ", ".join(
            f"{d.name} {len(g)} pairs -> {n} examples"
            for d, g, n in zip(directions, groups, counts, strict=True)
        ),
    )
    return ResampledPairs(pairs, positions)


__all__ = ["MultiCorpus", "ResampledPairs", "resample"]
