"""What the benchmark scripts share: the Multi30k corpus, batches and timing.

Text is read with litmt's line reader (`litmt.data.text.read_text_file`), the policy the
package applies to corpora, never `str.splitlines()` (which also splits on characters such
as U+2028 inside a line). Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from litmt.data.text import read_text_file
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerConfig
from litmt.errors import LitmtError

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO / ".." / "shared" / "data" / "multi30k"

T = TypeVar("T")


# -- exports ----------------------------------------------------------------------------
def export_of(
    ckpt: Path,
    given: str | None,
    flag: str,
    checkpoint_sha256: Callable[[Path], str],
    make: Callable[[], Path],
) -> Path:
    """The export a parity benchmark compares with `ckpt`: `given` (the value of `flag`) once
    its recorded checkpoint digest (`checkpoint_sha256` reads it) matches `ckpt`'s, else
    ``make()``.

    Raises:
        LitmtError: `given` is an export of another checkpoint.
    """
    if given is None:
        return make()
    from litmt.deploy.export.base import file_sha256

    export = Path(given)
    if checkpoint_sha256(export) != file_sha256(ckpt):
        raise LitmtError(f"{flag} {export} is not an export of --ckpt {ckpt}")
    return export


# -- corpus -----------------------------------------------------------------------------
def multi30k_lines(split: str, lang: str, limit: int | None = None) -> list[str]:
    """The first `limit` (None: all) lines of Multi30k's ``<split>.<lang>``."""
    path = MULTI30K / f"{split}.{lang}"
    if not path.is_file():
        raise LitmtError(
            f"{path} not found; the benchmark needs Multi30k in ../shared/data/multi30k"
        )
    lines = read_text_file(path, f"{split}.{lang}")
    return lines[:limit] if limit else lines


def parallel_lines(src: str, ref: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Source lines and their references (the first `limit` of each; None/0 = all).

    Raises:
        LitmtError: a file cannot be read, or the two files differ in line count.
    """
    sources, refs = read_text_file(src, "--src"), read_text_file(ref, "--ref")
    if len(sources) != len(refs):
        raise LitmtError(f"{len(sources)} source lines but {len(refs)} references")
    return (sources[:limit], refs[:limit]) if limit else (sources, refs)


def checkpoint_run(args: Any) -> tuple[list[str], list[str], Path, Any]:
    """What a checkpoint benchmark starts with: (`args.src` lines, `args.ref` lines, the
    checkpoint `args.ckpt`, its torch `Translator` on the CPU), torch at `args.threads`."""
    from litmt.decoding.translator import Translator

    src, ref = parallel_lines(args.src, args.ref, args.limit)
    torch.set_num_threads(args.threads)
    ckpt = Path(args.ckpt)
    return src, ref, ckpt, Translator.from_checkpoint(ckpt, device="cpu")


def load_tokenizer(vocab_size: int, lines: int | None, cache: Path) -> Tokenizer:
    """A joint sentencepiece model trained on Multi30k train (cached under `cache`)."""
    settings = TokenizerConfig(vocab_size=vocab_size)
    where = cache / f"tokenizer-{settings.key()}-lines{lines or 'all'}"
    if (where / "src.model").exists():
        return Tokenizer.load(where)
    en, de = (multi30k_lines("train", lang, lines) for lang in ("en", "de"))
    tok = Tokenizer.train(en, de, settings)
    tok.save(where)
    return tok


# -- batches ----------------------------------------------------------------------------
@dataclass
class Batch:
    """One teacher-forced batch: src (B, S), tgt_in = bos+y (B, T), tgt_out = y+eos (B, T)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    n_tokens: int = field(init=False)  # non-padding target tokens

    def __post_init__(self) -> None:
        self.n_tokens = int(self.tgt_out.ne(PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device))


def pad(rows: list[list[int]]) -> Tensor:
    """Right-pad id lists into a (B, L) long tensor."""
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def training_batches(tok: Tokenizer, max_tokens: int, count: int, seed: int = 0) -> list[Batch]:
    """`count` length-sorted token-budget batches (≤ max_tokens padded target tokens)."""
    src = tok.encode_src(multi30k_lines("train", "en"))
    tgt = tok.encode_tgt(multi30k_lines("train", "de"))
    pairs = sorted(
        ((s[:126], t[:126]) for s, t in zip(src, tgt, strict=True) if s and t),
        key=lambda p: (len(p[1]), len(p[0])),
    )
    batches, cur = [], []
    for p in pairs:
        if cur and (len(cur) + 1) * (len(p[1]) + 1) > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(p)
    batches.append(cur)
    # Skip the shortest and longest buckets: a typical batch, the same for every model.
    middle = batches[len(batches) // 10 : -len(batches) // 10 or None]
    chosen = random.Random(seed).sample(middle, min(count, len(middle)))
    return [
        Batch(
            pad([s for s, _ in b]),
            pad([[BOS_ID, *t] for _, t in b]),
            pad([[*t, EOS_ID] for _, t in b]),
        )
        for b in chosen
    ]


def decode_sources(tok: Tokenizer, n: int) -> Tensor:
    """(B, S) the first `n` test2016 source sentences."""
    return pad(tok.encode_src(multi30k_lines("test2016", "en", n)))


# -- timing -----------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    """Wait for `device`'s queued work (CUDA kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of `fn`, `device` synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def add_test_set_args(p: Any, split_help: str) -> None:
    """The arguments of a report that decodes a corpus's test split on the ct2 engine:
    ``--data-dir``, ``--split``, ``--src-lang``, ``--tgt-lang``, ``--threads``, ``--reps``."""
    p.add_argument("--data-dir", required=True, help="the corpus directory ({split}.{lang})")
    p.add_argument("--split", default="test2016", help=split_help)
    p.add_argument("--src-lang", default="en", help="source language suffix")
    p.add_argument("--tgt-lang", default="de", help="target language suffix")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of the ct2 engine")
    p.add_argument("--reps", type=int, default=3, help="timed runs per row (median)")


def median_timed(fn: Callable[[], T], reps: int) -> tuple[T, float]:
    """(output of the last run, median seconds over `reps` runs) of a CPU-side call."""
    times: list[float] = []
    out: T | None = None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    assert out is not None, "reps must be at least 1"
    return out, statistics.median(times)


# Options that only say where this run keeps its own files (a JSON copy, a kept folder, a
# working directory): their values are this machine's paths and change no measured number,
# so a record's command leaves them out.
LOCAL_OUTPUT_OPTIONS = ("--json", "--out", "--work")
_LOCAL_OUTPUT_PREFIXES = tuple(f"{option}=" for option in LOCAL_OUTPUT_OPTIONS)


def published_argv(argv: list[str]) -> list[str]:
    """`argv` without `LOCAL_OUTPUT_OPTIONS` and their values (``--json F`` or ``--json=F``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LOCAL_OUTPUT_OPTIONS:
            skip = True
        elif not arg.startswith(_LOCAL_OUTPUT_PREFIXES):
            kept.append(arg)
    return kept


def write_result_record(
    record_id: str,
    title: str,
    module: str,
    argv: list[str],
    values: dict[str, float],
    units: dict[str, str],
    notes: str = "",
) -> Path:
    """Write a benchmark's result record (`litmt.records`, ``docs/results/records/<id>.json``
    in this repository) with this machine, the time now and the command as typed
    (``python -m <module> <argv>``, without the options that name local output files:
    `published_argv`); returns its path. Regenerate the results page after it:
    ``python -m reports.results_page``."""
    import shlex

    from litmt.records import Record, machine_description, utc_now, write_record

    record = Record(
        id=record_id,
        title=title,
        date=utc_now(),
        machine=machine_description(),
        command=" ".join(["python -m", module, *map(shlex.quote, published_argv(argv))]),
        values={k: float(v) for k, v in values.items()},
        units=units,
        notes=notes,
    )
    return write_record(record, REPO)
