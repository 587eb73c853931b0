"""Preprocessing between raw text and the sampler: tokenise into a `datasets` cache, read the
ids back as flat arrays, and filter training pairs.

Ragged id arrays are kept flat: `values` (all ids concatenated) and `offsets` (N+1,), row i
being `values[offsets[i]:offsets[i + 1]]`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from litmt.data.corpus import short_hash
from litmt.data.tokenizer import Tokenizer
from litmt.errors import DataError

log = logging.getLogger(__name__)

# Splits at least this long show `datasets`' progress bar while they are tokenised (a WMT
# training split takes minutes); smaller ones only log a line before and after.
PROGRESS_BAR_MIN_PAIRS = 100_000


@dataclass
class FilterSettings:
    """Training-split filters (`data.filter`); valid/test are never filtered."""

    min_len: int = 1  # drop pairs with a side shorter than this many tokens
    max_len: int = 256  # drop pairs with a side longer than this many tokens
    max_ratio: float | None = 3.0  # drop pairs whose length ratio exceeds this (None = off)


def filter_pairs(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, settings: FilterSettings
) -> tuple[np.ndarray, dict[str, int]]:
    """Which training pairs to keep, and how many each rule removed.

    Rules apply in order (a pair counts under the first rule it breaks): an empty side; a side
    shorter than `min_len`; a side longer than `max_len`; a longer/shorter ratio above
    `max_ratio`.

    Args:
        src_lengths, tgt_lengths: (N,) token counts (no bos/eos).
        settings: the thresholds.

    Returns:
        ((N,) bool keep-mask, counts with keys total, kept, empty, too_short, too_long,
        bad_ratio); the counts are logged.

    Raises:
        DataError: no pair is left.
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
    c = counts
    log.info(
        "train filter: kept %d of %d pairs (empty %d, shorter than %d: %d, longer than %d: "
        "%d, length ratio > %s: %d)",
        c["kept"], c["total"], c["empty"], f.min_len, c["too_short"], f.max_len,
        c["too_long"], f.max_ratio, c["bad_ratio"],
    )  # fmt: skip
    if not c["kept"]:
        raise DataError(
            f"no training pairs left after filtering {c['total']} (see data.filter: min_len, "
            f"max_len, max_ratio); loosen the filters or check the corpus"
        )
    return keep, counts


def split_ids(ds: datasets.Dataset, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list-of-int column, zero-copy from Arrow."""
    arr = ds.data.column(column).combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


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


@contextlib.contextmanager
def _quiet_datasets(show: bool = False) -> Iterator[None]:
    """Silence `datasets` progress bars (they flood training logs) unless `show`; restore
    the previous setting afterwards."""
    was_enabled = datasets.is_progress_bar_enabled()
    if show:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
        else:
            datasets.disable_progress_bars()


_TOKENIZERS: dict[str, Tokenizer] = {}  # per worker process, keyed by model digest


def _encode_batch(batch: dict[str, list[Any]], tokenizer: dict[str, Any]) -> dict[str, Any]:
    key = short_hash(*tokenizer.values())
    tok = _TOKENIZERS.get(key)
    if tok is None:
        tok = _TOKENIZERS[key] = Tokenizer.from_dict(tokenizer)
    return {
        "src_ids": tok.encode_src([s or "" for s in batch["src"]]),
        "tgt_ids": tok.encode_tgt([t or "" for t in batch["tgt"]]),
    }


def is_cached(path: Path) -> bool:
    """True when `tokenize_to_disk` has published `path` completely."""
    return (path / "dataset_info.json").exists()


def tokenize_to_disk(
    raw: datasets.Dataset, tok: Tokenizer, path: Path, num_proc: int | None, desc: str = ""
) -> None:
    """Add `src_ids`/`tgt_ids` (int32, no bos/eos) to `raw` and `save_to_disk` it at `path`.

    Uses `num_proc` processes when the split has at least 1000 pairs per process. The
    directory is published atomically (written under a temporary name, then renamed); when
    another process published it first, its copy is kept.
    """
    big = num_proc is not None and num_proc > 1 and len(raw) >= 1000 * num_proc
    features = raw.features.copy()
    features["src_ids"] = datasets.List(datasets.Value("int32"))  # int32 halves the memory
    features["tgt_ids"] = datasets.List(datasets.Value("int32"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    show = len(raw) >= PROGRESS_BAR_MIN_PAIRS
    log.info("%s: %d pairs → %s", desc or "tokenising", len(raw), path)
    t0 = time.perf_counter()
    with _quiet_datasets(show):
        ds = raw.map(
            _encode_batch,
            batched=True,
            batch_size=2000,
            num_proc=num_proc if big else None,
            fn_kwargs={"tokenizer": tok.to_dict()},
            features=features,
            new_fingerprint=path.name,
            desc=desc,
        )
    with _quiet_datasets():
        ds.save_to_disk(str(tmp))
    seconds = time.perf_counter() - t0
    log.info(
        "%s: done in %.1fs (%.0f pairs/s)",
        desc or "tokenising",
        seconds,
        len(raw) / max(seconds, 1e-9),
    )
    try:
        tmp.rename(path)  # atomic publish
    except OSError:  # another process published first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
