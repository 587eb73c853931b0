"""A split's sentence pairs as a stream of chunks, never the whole corpus in memory.

`pair_chunks(main, sources, split)` yields ``(sources, targets)`` lists of at most `chunk`
pairs, in example-index order: the main corpus's split (every shard of a text split, in
order), then, for the training split, each `data.extra_train` source (tagged where it says
so). Plain text and TSV are read line by line (`litmt.data.text.read_lines`); JSONL,
parquet and hub tables are Arrow files on disk, read in record batches.

`count_pairs` counts the pairs without tokenising (a fast newline count for text), for the
progress bar's ETA.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.sources import TrainSource
from litmt.data.text import read_lines
from litmt.errors import DataError

Chunk = tuple[list[str], list[str]]  # (sources, targets), the same length


def _count_lines(path: Path) -> int:
    """Lines of `path` under the `read_lines` policy (a final newline adds none)."""
    n, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _text_pairs(src_file: Path, tgt_file: Path) -> Iterator[tuple[str, str]]:
    """The aligned lines of one text shard; a line-count mismatch is a `DataError`."""
    with src_file.open("rb") as fs, tgt_file.open("rb") as ft:
        src = read_lines(fs, str(src_file), strict=True)
        tgt = read_lines(ft, str(tgt_file), strict=True)
        for s, t in itertools.zip_longest(src, tgt):
            if s is None or t is None:
                raise DataError(
                    f"{src_file} has {_count_lines(src_file)} lines but {tgt_file} has "
                    f"{_count_lines(tgt_file)}; the two sides of a parallel corpus must align "
                    f"line by line"
                )
            yield s, t


def _tsv_pairs(corpus: ParallelCorpus, path: Path) -> Iterator[tuple[str, str]]:
    src_col, tgt_col = corpus._column_keys()
    with path.open("rb") as f:
        lines = read_lines(f, str(path), strict=True)
        header = next(lines, None)
        if header is None:
            raise DataError(f"{path} is empty; a TSV needs a header row and data rows")
        names = header.split("\t")
        for lang, c in ((corpus.src_lang, src_col), (corpus.tgt_lang, tgt_col)):
            if c not in names:
                raise DataError(
                    f"{path}: no column {c!r} for language {lang!r} (columns: "
                    f"{', '.join(names)}); set data.columns.{lang}=COLUMN"
                )
        si, ti = names.index(src_col), names.index(tgt_col)
        for number, line in enumerate(lines, start=2):
            row = line.split("\t")
            if len(row) != len(names):
                raise DataError(
                    f"{path}: line {number} has {len(row)} tab-separated fields but the header "
                    f"has {len(names)}; remove stray tabs or quote nothing"
                )
            yield row[si], row[ti]


def _corpus_chunks(corpus: ParallelCorpus, split: str, chunk: int) -> Iterator[Chunk]:
    if corpus.is_local and corpus.format in ("text", "tsv"):
        if corpus.format == "text":
            pairs = itertools.chain.from_iterable(
                _text_pairs(s, t) for s, t in corpus.shards(split)
            )
        else:
            pairs = _tsv_pairs(corpus, corpus.files(split)[0])
        while block := list(itertools.islice(pairs, chunk)):
            yield [p[0] for p in block], [p[1] for p in block]
        return
    ds = corpus.load(split)  # Arrow on disk, memory-mapped: read in record batches
    for batch in ds.iter(batch_size=chunk):
        yield [s or "" for s in batch["src"]], [t or "" for t in batch["tgt"]]


def pair_chunks(
    main: ParallelCorpus,
    sources: list[TrainSource],
    split: str,
    *,
    chunk: int = 10_000,
    limit: int | None = None,
) -> Iterator[Chunk]:
    """The pairs of `split` (train: with every extra source), `chunk` at a time.

    Args:
        limit: stop after this many pairs (`data.limit`; None = all).

    Raises:
        DataError: a shard's sides differ in line count, a file is not UTF-8, the split is
        empty, or a table lacks a column.
    """
    parts = [(main, None)] + ([(s.corpus, s.tag) for s in sources] if split == "train" else [])
    seen = 0
    for corpus, tag in parts:
        for src, tgt in _corpus_chunks(corpus, split if tag is None else "train", chunk):
            if limit is not None and seen + len(src) > limit:
                src, tgt = src[: limit - seen], tgt[: limit - seen]
            if tag is not None:  # empty lines stay empty, so that the filter drops them
                src = [f"{tag} {s}" if s else "" for s in src]
            seen += len(src)
            if src:
                yield src, tgt
            if limit is not None and seen >= limit:
                return
    if not seen:
        main.load(split)  # raises the format's own one-line error for an empty split
        raise DataError(f"the {split!r} split is empty; point data at a real corpus")


def count_pairs(main: ParallelCorpus, sources: list[TrainSource], split: str) -> int | None:
    """Pairs in `split` without tokenising (None when a source cannot tell cheaply)."""
    parts = [main] + ([s.corpus for s in sources] if split == "train" else [])
    total = 0
    for corpus in parts:
        name = split if corpus is main else "train"
        if corpus.is_local and corpus.format == "text":
            total += sum(_count_lines(s) for s, _ in corpus.shards(name))
        elif corpus.is_local and corpus.format == "tsv":
            total += _count_lines(corpus.files(name)[0]) - 1
        else:
            return None
    return total
