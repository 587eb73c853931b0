"""Preprocessing between raw text and the sampler: tokenise a stream of pair chunks (in
parallel) into the memory-mapped cache (`litmt.data.preparation.memmap`), filtering and de-duplicating
training pairs on the way.

Ragged id arrays are kept flat: `values` (all ids concatenated) and `offsets` (N+1,), row i
being `values[offsets[i]:offsets[i + 1]]`.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import logging
import multiprocessing
import pickle
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from litmt.config import renamed_attribute
from litmt.data.preparation.memmap import CacheWriter
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import DataError

log = logging.getLogger(__name__)

# Splits at least this long show a progress bar with an ETA while they are tokenised (a WMT
# training split takes minutes); smaller ones only log a line before and after.
PROGRESS_BAR_MIN_PAIRS = 100_000

# What a user reads when a tokenising worker dies. Workers are started by `spawn`, which
# re-runs the launching script: without a main guard each worker fails at start.
WORKER_DIED = (
    "a tokenising worker process died (num_proc={procs}); workers are started with 'spawn', "
    "which re-runs the launching script, so a script without an `if __name__ == "
    '"__main__":` guard makes each worker fail at start: add the guard, or set num_proc=1 '
    "(data.num_proc); otherwise the worker may have run out of memory"
)


@dataclass
class FilterConfig:
    """Training-split filters (`data.filter`); valid/test are never filtered."""

    min_len: int = 1
    """drop pairs with a side shorter than this (tokens)"""
    max_len: int = 256
    """drop pairs with a side longer than this (tokens); lowered to what max_tokens and
    max_positions leave"""
    max_ratio: float | None = 3.0
    """drop pairs whose longer/shorter token ratio exceeds this; .inf = off"""
    dedup: bool = False
    """drop exact duplicate (source, target) pairs after the first (streamed, 8 bytes per
    pair): a source seen with another target stays"""


def filter_mask(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, settings: FilterConfig
) -> tuple[np.ndarray, dict[str, int]]:
    """Which pairs pass the length rules, and how many each rule removed (not logged).

    Rules apply in order (a pair counts under the first rule it breaks): an empty side; a side
    shorter than `min_len`; a side longer than `max_len`; a longer/shorter ratio above
    `max_ratio`.

    Args:
        src_lengths, tgt_lengths: (N,) token counts (no bos/eos).

    Returns:
        ((N,) bool keep-mask, counts with keys total, kept, empty, too_short, too_long,
        bad_ratio).
    """
    ls, lt, f = np.asarray(src_lengths), np.asarray(tgt_lengths), settings
    empty = (ls == 0) | (lt == 0)
    short = ~empty & ((ls < f.min_len) | (lt < f.min_len))
    long_ = ~empty & ~short & ((ls > f.max_len) | (lt > f.max_len))
    ratio = np.zeros(len(ls), dtype=bool)
    if f.max_ratio is not None:
        r = np.maximum(ls, lt) / np.maximum(np.minimum(ls, lt), 1)
        ratio = ~empty & ~short & ~long_ & (r > f.max_ratio)
    keep = ~(empty | short | long_ | ratio)
    counts = {
        "total": len(ls), "kept": int(keep.sum()), "empty": int(empty.sum()),
        "too_short": int(short.sum()), "too_long": int(long_.sum()), "bad_ratio": int(ratio.sum()),
    }  # fmt: skip
    return keep, counts


def report_filter(counts: dict[str, int], settings: FilterConfig) -> None:
    """Log the filter counts.

    Raises:
        DataError: no pair is left.
    """
    c, f = counts, settings
    log.info(
        "train filter: kept %d of %d pairs (empty %d, shorter than %d: %d, longer than %d: "
        "%d, length ratio > %s: %d, duplicates: %d)",
        c["kept"], c["total"], c["empty"], f.min_len, c["too_short"], f.max_len,
        c["too_long"], f.max_ratio, c["bad_ratio"], c.get("duplicate", 0),
    )  # fmt: skip
    if not c["kept"]:
        raise DataError(
            f"no training pairs left after filtering {c['total']} (see data.filter: min_len, "
            f"max_len, max_ratio, dedup); loosen the filters or check the corpus"
        )


class PairDeduper:
    """Exact duplicate removal over a stream: 64-bit hashes of the pairs seen so far, kept in
    a few sorted arrays (8 bytes per kept pair; merged like a log-structured tree)."""

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []

    def first_seen(self, hashes: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(n,) bool: candidates whose hash was not seen before (earlier in this chunk
        included); those hashes are remembered."""
        idx = np.flatnonzero(candidates)
        _, first = np.unique(hashes[idx], return_index=True)
        new = np.zeros(len(hashes), dtype=bool)
        new[idx[first]] = True
        for level in self.levels:
            pos = np.minimum(np.searchsorted(level, hashes), len(level) - 1)
            new &= level[pos] != hashes
        if new.any():
            self.levels.append(np.sort(hashes[new]))
        while len(self.levels) > 1 and len(self.levels[-2]) <= 2 * len(self.levels[-1]):
            top = self.levels.pop()
            self.levels[-1] = np.sort(np.concatenate([self.levels[-1], top]))
        return new


def gather_rows(
    values: np.ndarray, offsets: np.ndarray, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows `pos` of a flat (values, offsets) ragged array."""
    lens = offsets[pos + 1] - offsets[pos]
    new_off = np.zeros(len(pos) + 1, dtype=np.int64)
    new_off[1:] = np.cumsum(lens)
    starts = np.repeat(offsets[pos] - new_off[:-1], lens)
    idx = np.arange(new_off[-1], dtype=np.int64) + starts
    return values[idx], new_off


_TOKENIZER: list[Tokenizer] = []  # the tokenizer of this (worker) process


def _init_worker(tokenizer_file: str) -> None:
    """Load the tokenizer a worker encodes with (`_workers` wrote it to `tokenizer_file`)."""
    _TOKENIZER[:] = [Tokenizer.from_dict(pickle.loads(Path(tokenizer_file).read_bytes()))]


@contextlib.contextmanager
def _workers(tok: Tokenizer, procs: int, folder: Path) -> Iterator[ProcessPoolExecutor | None]:
    """`procs` spawned tokenising processes, shut down on exit; None when `procs` is 1
    (this process encodes).

    `concurrent.futures.ProcessPoolExecutor` fails every pending chunk with
    `BrokenProcessPool` when a worker dies, where `multiprocessing.Pool` would start another
    and leave the caller waiting. The tokenizer reaches the workers as a file in `folder`,
    so that what the spawn pipe carries stays far below the pipe's 64 KiB buffer: a worker
    that dies at start (a script without a main guard) never reads that pipe, and a larger
    write (the models are about 240 kB) would block the parent for good.
    """
    if procs <= 1:
        _TOKENIZER[:] = [tok]
        yield None
        return
    file = folder / "tokenizer.pickle"
    file.write_bytes(pickle.dumps(tok.to_dict()))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running torch
    pool = ProcessPoolExecutor(procs, ctx, _init_worker, (str(file),))
    try:
        yield pool
    finally:  # waits for the chunks in flight (at most 2 per process)
        pool.shutdown(wait=True, cancel_futures=True)
        file.unlink(missing_ok=True)


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lens.sum()))
    return ids, lens


def _pair_hashes(src: list[str], tgt: list[str]) -> np.ndarray:
    out = np.empty(len(src), dtype=np.uint64)
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
        b = s.encode("utf-8")
        key = len(b).to_bytes(8, "little") + b + t.encode("utf-8")
        out[i] = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return out


def _encode_chunk(src: list[str], tgt: list[str], dedup: bool) -> tuple[Any, ...]:
    """((src ids, src lens), (tgt ids, tgt lens), pair hashes or None) of one chunk."""
    tok = _TOKENIZER[0]
    return (
        _flat(tok.encode_src(src)),
        _flat(tok.encode_tgt(tgt)),
        (_pair_hashes(src, tgt) if dedup else None),
    )


def _encoded(
    chunks: Iterable[tuple[list[str], list[str]]],
    pool: ProcessPoolExecutor | None,
    procs: int,
    dedup: bool,
) -> Iterator[tuple[Any, ...]]:
    """Encoded chunks in order; with a pool, at most 2 chunks per process in flight (the
    corpus is never read ahead into memory).

    Raises:
        DataError: a worker process died (`WORKER_DIED`).
    """
    if pool is None:
        for src, tgt in chunks:
            yield _encode_chunk(src, tgt, dedup)
        return
    pending: collections.deque[Future[tuple[Any, ...]]] = collections.deque()
    try:
        for src, tgt in chunks:
            pending.append(pool.submit(_encode_chunk, src, tgt, dedup))
            if len(pending) >= 2 * procs:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool as exc:
        log.debug("tokenising pool broken: %s", exc)
        raise DataError(WORKER_DIED.format(procs=procs)) from None


def _offsets(lens: np.ndarray) -> np.ndarray:
    off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return off


def _kept(
    encoded: tuple[Any, ...],
    filters: FilterConfig | None,
    dedup: PairDeduper | None,
    counts: collections.Counter[str],
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The pairs of one encoded chunk that pass the filters and de-duplication.

    Returns:
        each side as (flat ids, (k,) lengths), and (k,) their positions in the chunk;
        `counts` is updated.
    """
    (src, sl), (tgt, tl), hashes = encoded
    keep = np.ones(len(sl), dtype=bool)
    if filters is not None:
        keep, c = filter_mask(sl, tl, filters)
        counts.update(c)
    if dedup is not None:
        new = dedup.first_seen(hashes, keep)
        counts["duplicate"] += int(keep.sum() - new.sum())
        counts["kept"] -= int(keep.sum() - new.sum())
        keep = new
    pos = np.flatnonzero(keep)
    if len(pos) == len(sl):
        return (src, sl), (tgt, tl), pos
    src_ids, tgt_ids = (
        gather_rows(src, _offsets(sl), pos)[0],
        gather_rows(tgt, _offsets(tl), pos)[0],
    )
    return (src_ids, sl[pos]), (tgt_ids, tl[pos]), pos


def tokenize_to_cache(
    chunks: Iterable[tuple[list[str], list[str]]],
    tok: Tokenizer,
    path: Path,
    *,
    num_proc: int | None,
    total: int | None,
    filters: FilterConfig | None = None,
    desc: str = "tokenising",
) -> dict[str, int] | None:
    """Tokenise `chunks` (in order) into the cache at `path`, published atomically.

    Args:
        num_proc: worker processes (used when the split has >= 1000 pairs per process).
        total: pairs in the stream if known (the progress bar's ETA).
        filters: the training filters and de-duplication (None: keep every pair).

    Returns:
        the filter counts (None without `filters`), also stored in the cache's metadata.

    Raises:
        DataError: no pair left after filtering, the disk is full (`litmt.data.preparation.memmap`), or
            a worker process died (`WORKER_DIED`: e.g. a script without a main guard).
    """
    procs = num_proc or 1
    parallel = procs > 1 and (total is None or total >= 1000 * procs)
    writer = CacheWriter(path, max(tok.src_vocab_size, tok.tgt_vocab_size))
    dedup = PairDeduper() if filters is not None and filters.dedup else None
    counts: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    log.info("%s: %s pairs → %s", desc, total if total is not None else "?", path)
    show = total is None or total >= PROGRESS_BAR_MIN_PAIRS
    base = 0
    try:
        with (
            _workers(tok, procs if parallel else 1, writer.tmp) as pool,
            tqdm(total=total, desc=desc, unit="pairs", disable=not show, smoothing=0.1) as bar,
        ):
            for encoded in _encoded(chunks, pool, procs, dedup is not None):
                src, tgt, pos = _kept(encoded, filters, dedup, counts)
                writer.add(src, tgt, base + pos)
                n = len(encoded[0][1])
                base += n
                bar.update(n)
        result = None
        if filters is not None:
            result = {k: counts[k] for k in ("total", "kept", "empty", "too_short", "too_long",
                                               "bad_ratio", "duplicate")}  # fmt: skip
            report_filter(result, filters)
        writer.publish({"filter_counts": result})
    except BaseException:
        writer.abort()
        raise
    seconds = time.perf_counter() - t0
    log.info("%s: done in %.1fs (%d pairs, %.0f pairs/s)", desc, seconds, base,
             base / max(seconds, 1e-9))  # fmt: skip
    return result


def __getattr__(name: str) -> Any:
    """Old names of this module's classes, kept one release (`litmt.config.renamed_attribute`)."""
    return renamed_attribute(__name__, name, {"FilterSettings": "FilterConfig"}, globals())
