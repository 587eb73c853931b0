"""The sentences sentencepiece trains on: a bounded random sample, streamed from disk.

The training split is read twice in chunks (`litmt.data.corpora.streams.pair_chunks`): once to count
its non-empty sentences, once to write the sampled ones into a scratch file. The sample is
`random.Random(seed).sample(range(n), input_sentence_size)` over the non-empty sentences
(joint vocabulary: every source sentence, then every target sentence), fed to sentencepiece
in that sample's order; when `n <= input_sentence_size` (or it is 0, as in sentencepiece)
every sentence is used, in corpus order. Only the sampled positions live in memory, never the
text; sentencepiece then holds the sample in memory, and its size sets the peak memory of
preparation (docs/notebook/2026-12-03-preparation-memory.md).
"""

from __future__ import annotations

import array
import logging
import mmap
import random
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

Chunks = Callable[[], Iterable[tuple[list[str], list[str]]]]


class SentenceSample:
    """Sampled sentences of one side (or both, joint) in a scratch file, read back in order.

    Args:
        path: the scratch file (one sentence per line, in corpus order).
        order: (k,) line numbers of `path` in the order sentencepiece reads them.
    """

    def __init__(self, path: Path, offsets: np.ndarray, order: np.ndarray) -> None:
        self.path, self.offsets, self.order = path, offsets, order

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[str]:
        if not len(self.order):
            return
        with self.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            off = self.offsets
            for i in self.order.tolist():
                yield mm[off[i] : off[i + 1] - 1].decode("utf-8")


def _positions(n: int, k: int, seed: int) -> np.ndarray:
    """Sampled positions in sample order (all of `range(n)` when `n <= k`, or when `k <= 0`:
    sentencepiece's own `input_sentence_size=0` means every sentence)."""
    if k <= 0 or n <= k:
        return np.arange(n, dtype=np.int64)
    return np.fromiter(random.Random(seed).sample(range(n), k), dtype=np.int64, count=k)


def sample_sentences(
    chunks: Chunks, *, joint: bool, size: int, seed: int, workdir: Path
) -> list[SentenceSample]:
    """One sample (joint) or two (source, target) of at most `size` non-empty sentences.

    Args:
        chunks: a fresh iterator of (sources, targets) chunks on each call.
        workdir: where the scratch files go (deleted by the caller).
    """
    n_src = n_tgt = 0
    for src, tgt in chunks():  # pass 1: count
        n_src += sum(1 for s in src if s.strip())
        n_tgt += sum(1 for t in tgt if t.strip())
    # selected: global position -> sampled; joint positions run over sources, then targets
    if joint:
        plans = [_positions(n_src + n_tgt, size, seed)]
        bases = [(0, n_src)]  # source j -> j, target j -> n_src + j
    else:
        plans = [_positions(n_src, size, seed), _positions(n_tgt, size, seed)]
        bases = [(0, None), (None, 0)]
    workdir.mkdir(parents=True, exist_ok=True)
    picked = [np.sort(p) for p in plans]
    files = [[workdir / f"sample{i}.src", workdir / f"sample{i}.tgt"] for i in range(len(plans))]
    handles = [[f.open("wb") for f in pair] for pair in files]
    lens = [[array.array("q"), array.array("q")] for _ in plans]
    j_src = j_tgt = 0
    try:
        for src, tgt in chunks():  # pass 2: write the sampled sentences in corpus order
            for side, lines in ((0, src), (1, tgt)):
                kept = [s for s in lines if s.strip()]
                start = j_src if side == 0 else j_tgt
                for p, (base, sel) in enumerate(zip(bases, picked, strict=True)):
                    if base[side] is None:
                        continue
                    pos = np.arange(start, start + len(kept)) + base[side]
                    hit = np.flatnonzero(np.isin(pos, sel, assume_unique=True))
                    data = [kept[i].encode("utf-8") + b"\n" for i in hit.tolist()]
                    handles[p][side].write(b"".join(data))
                    lens[p][side].extend(len(d) for d in data)
                if side == 0:
                    j_src += len(kept)
                else:
                    j_tgt += len(kept)
    finally:
        for pair in handles:
            for h in pair:
                h.close()
    samples = []
    for p, plan in enumerate(plans):
        merged = workdir / f"sample{p}.txt"  # sources then targets: increasing position
        with merged.open("wb") as out:
            for f in files[p]:
                with f.open("rb") as part:
                    shutil.copyfileobj(part, out, 1 << 24)
                f.unlink()
        sizes = np.concatenate([np.frombuffer(a, dtype=np.int64) for a in lens[p]])
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        order = np.searchsorted(picked[p], plan)  # sample order -> line in `merged`
        total = (n_src + n_tgt) if joint else (n_src if p == 0 else n_tgt)
        if 0 < size < total:
            log.info(
                "tokenizer: sampled %d of %d sentences (data.tokenizer.input_sentence_size=%d)",
                len(plan), total, size,
            )  # fmt: skip
        samples.append(SentenceSample(merged, offsets, order))
    return samples
