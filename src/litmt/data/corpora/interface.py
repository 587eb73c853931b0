"""`Corpora`: the one interface the DataModule reads a split through, whatever the corpus.

Two kinds implement it:
- `PairCorpora` (here): one direction, its corpus and the `data.extra_train` sources
  appended to its training split (`litmt.data.corpora.sources`, `litmt.data.corpora.streams`);
- `litmt.data.corpora.multi.MultiCorpus`: several directions (`data.directions`), each example
  tagged with its target language, the training examples temperature-sampled.

What the DataModule asks of them: the split as a stream of chunks (preparation), its
fingerprint (cache keys), its size (the progress bar), its text (references and sources),
the training pairs as sampled across directions, the direction spans of a split and the
target prefixes decoding must force, the languages a checkpoint records, the corpora the
end of training scores, and the tags the tokenizer must keep whole.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import datasets

from litmt.data.batching.collate import TokenizedPairs
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.sources import TrainSource, load_split, source_tags, split_fingerprint
from litmt.data.corpora.streams import Chunk, count_pairs, pair_chunks
from litmt.data.directions import Direction

if TYPE_CHECKING:
    from litmt.data.tokenization.tokenizer import Tokenizer


class Corpora(ABC):
    """What a DataModule reads: the splits of one or several directions.

    `limit` arguments cap the training split (`data.limit`; None = all); callers pass it
    for ``train`` only.
    """

    directions: list[Direction]  # [] for one pair
    extra: list[TrainSource]  # data.extra_train, in config order

    @property
    @abstractmethod
    def main(self) -> ParallelCorpus:
        """The corpus of the (first) direction: its languages are the model's src/tgt."""

    @abstractmethod
    def fingerprint(self, split: str) -> str:
        """A cache key that changes when the split's content may have changed."""

    @abstractmethod
    def chunks(self, split: str, limit: int | None = None) -> Iterator[Chunk]:
        """The split's (sources, targets) pairs, a chunk at a time, in example-index order."""

    @abstractmethod
    def count(self, split: str, limit: int | None = None) -> int | None:
        """Pairs in the split before filtering (None when it cannot tell cheaply)."""

    @abstractmethod
    def load(self, split: str, limit: int | None = None) -> datasets.Dataset:
        """The split's whole text (`src`, `tgt`), in example-index order."""

    @abstractmethod
    def resample(
        self, pairs: TokenizedPairs, temperature: float, seed: int, limit: int | None
    ) -> TokenizedPairs:
        """The prepared training pairs as the epoch samples them across directions."""

    @abstractmethod
    def direction_spans(self, split: str) -> list[tuple[str, int, int]] | None:
        """Per direction, (``en-de``, first, end) example indices of `split`; None for one
        pair."""

    @abstractmethod
    def forced_prefixes(
        self, split: str, indices: Sequence[int], tokenizer: Callable[[], Tokenizer]
    ) -> list[list[int]] | None:
        """Per example index, the target ids decoding must start with; None = none forced.

        Args:
            tokenizer: gives the tokenizer, called only when a prefix is forced.
        """

    @abstractmethod
    def languages_meta(self) -> dict[str, Any]:
        """What a checkpoint records of its languages beside src_lang/tgt_lang."""

    @abstractmethod
    def scored(self) -> ParallelCorpus | list[ParallelCorpus]:
        """What the end of training scores: the corpus, or one per direction."""

    @abstractmethod
    def tags(self) -> list[str]:
        """The tags its text carries, which the tokenizer keeps as one piece each."""


@dataclass
class PairCorpora(Corpora):
    """One direction: `main` and the extra training sources appended to its train split."""

    corpus: ParallelCorpus
    extra: list[TrainSource] = field(default_factory=list)
    directions: list[Direction] = field(default_factory=list, init=False)

    @property
    def main(self) -> ParallelCorpus:
        return self.corpus

    def fingerprint(self, split: str) -> str:
        return split_fingerprint(self.corpus, self.extra, split)

    def chunks(self, split: str, limit: int | None = None) -> Iterator[Chunk]:
        """`litmt.data.corpora.streams.pair_chunks`: `limit` counts the extra sources too."""
        return pair_chunks(self.corpus, self.extra, split, limit=limit)

    def count(self, split: str, limit: int | None = None) -> int | None:
        n = count_pairs(self.corpus, self.extra, split)
        return n if n is None or limit is None else min(n, limit)

    def load(self, split: str, limit: int | None = None) -> datasets.Dataset:
        ds = load_split(self.corpus, self.extra, split)
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        return ds

    def resample(
        self, pairs: TokenizedPairs, temperature: float, seed: int, limit: int | None
    ) -> TokenizedPairs:
        return pairs  # one direction: nothing to balance

    def direction_spans(self, split: str) -> None:
        return None

    def forced_prefixes(
        self, split: str, indices: Sequence[int], tokenizer: Callable[[], Tokenizer]
    ) -> None:
        return None

    def languages_meta(self) -> dict[str, Any]:
        return {}

    def scored(self) -> ParallelCorpus:
        return self.corpus

    def tags(self) -> list[str]:
        return source_tags(self.extra)


__all__ = ["Corpora", "PairCorpora"]
