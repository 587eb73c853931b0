"""Sequence-level knowledge distillation (Kim & Rush 2016): a corpus translated by a teacher.

`distill_corpus` translates a training split chunk by chunk with any engine's translator
(`litmt.decoding.translator_base.BaseTranslator`) and writes ``{out}/train.{src,tgt}`` (the
source lines and the teacher's translations), the layout ``data.dir`` reads.

Which hypothesis a line keeps (`choose`): the teacher's best (``select=top``), or with
``select=closest`` Seq-Inter (Kim & Rush 2016): of its n-best, the one with the highest
sentence BLEU against the line's reference (the split's target side).

Resuming (`DistillOutput`): the pairs of each chunk are appended to ``train.{lang}.part`` (and
their cross-entropies to ``cross_entropy.part``) and flushed, then the progress marker
``.distill-progress.json`` (chunks done, the part files' byte lengths, the counts, the
settings) is replaced atomically. A rerun with the same settings truncates the parts to the
marker's lengths (a run killed mid-chunk leaves extra bytes) and continues with the next
chunk; other settings are refused. At the end the parts are copied to ``train.{lang}``
(without the pairs the cross-entropy filter drops), the provenance ``distill.json`` is
written, then the marker and the parts are removed.

Filters, counted and logged: per chunk (`filter_pairs`) an empty source or translation, a
longer/shorter subword-token ratio above ``max_ratio``, a translation that copies its source;
at the end, over the whole corpus (`worst`), the share ``filter_ce_quantile`` of the pairs
left that the teacher scores worst per token.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from litmt.errors import ConfigError, DataError
from litmt.metrics import sentence_bleu

log = logging.getLogger(__name__)

PROVENANCE_FILE = "distill.json"
MARKER_FILE = ".distill-progress.json"
SCORES_PART = "cross_entropy.part"
FORMAT = 1
SELECT = ("top", "closest")


@dataclass
class DistillConfig:
    """The distill command's settings (conf/distill.yaml); the teacher is the load group's
    ``ckpt_path``, the decoding the decoding and engine groups."""

    out: str | None = None
    """directory of the distilled corpus: train.{src_lang}, train.{tgt_lang} and distill.json
    (required; a rerun with the same settings resumes, other settings are refused)"""
    chunk_lines: int = 2000
    """source lines translated between two progress markers (what an interruption loses)"""
    max_tokens: int = 4096
    """padded source tokens per decoding batch"""
    max_chunks: int | None = None
    """translate at most this many chunks in this run, then stop (a rerun continues); null =
    to the end"""
    select: str = "top"
    """the hypothesis a line keeps: top (the teacher's best) or closest (Seq-Inter, Kim & Rush
    2016: of its n-best, n_best=N, the one with the highest sentence BLEU against the line's
    reference, the training split's target side)"""
    max_ratio: float = 3.0
    """drop pairs whose longer/shorter subword-token ratio exceeds this; .inf = off"""
    drop_copies: bool = True
    """drop pairs whose translation equals the source (case and spacing ignored)"""
    filter_ce_quantile: float | None = None
    """drop this share of the pairs the other filters keep, those the teacher scores worst per
    token (cross-entropy -log P / (tokens + eos), over the whole corpus at the end; e.g. 0.05);
    null = off"""
    progress: bool = True
    """a progress bar with an ETA on stderr"""

    def __post_init__(self) -> None:
        if int(self.chunk_lines) < 1:
            raise ConfigError(f"chunk_lines must be >= 1, got {self.chunk_lines}")
        if self.max_chunks is not None and int(self.max_chunks) < 1:
            raise ConfigError(f"max_chunks must be >= 1 or null, got {self.max_chunks}")
        try:  # ``max_ratio=.inf`` reaches here as the string ".inf" (Hydra spells it inf)
            ratio = float(str(self.max_ratio).replace(".inf", "inf"))
        except ValueError:
            raise ConfigError(
                f"max_ratio must be a number >= 1 or .inf, got {self.max_ratio!r}"
            ) from None
        if ratio < 1:
            raise ConfigError(f"max_ratio must be >= 1 (.inf = off), got {self.max_ratio}")
        self.max_ratio = ratio
        if self.select not in SELECT:
            raise ConfigError(f"select must be top or closest, got {self.select!r}")
        quantile = self.filter_ce_quantile
        if quantile is not None:
            try:
                self.filter_ce_quantile = float(quantile)
            except (TypeError, ValueError):
                self.filter_ce_quantile = -1.0  # refused below
            if not 0 <= self.filter_ce_quantile < 1:
                raise ConfigError(
                    f"filter_ce_quantile must be in [0, 1) (a share of the pairs) or null, got "
                    f"{quantile!r}"
                )


@dataclass(frozen=True)
class Candidate:
    """One of the teacher's hypotheses of a source line."""

    text: str
    tokens: int
    """its subword tokens (what the length-ratio filter counts)"""
    cross_entropy: float
    """the teacher's per-token cross-entropy of it: -log P / (its tokens + eos)"""


def choose(
    candidates: list[list[Candidate]], references: list[str], select: str
) -> list[Candidate]:
    """The candidate each source line keeps.

    Args:
        candidates: per line, the teacher's hypotheses, best first (at least one).
        references: per line, its reference translation (used by ``closest``).
        select: ``top`` (the first) or ``closest`` (the highest `sentence_bleu` against the
            reference; ties: the better-ranked).
    """
    if select == "top":
        return [row[0] for row in candidates]
    return [
        max(row, key=lambda c, r=ref: sentence_bleu(c.text, r))  # max keeps the first of ties
        for row, ref in zip(candidates, references, strict=True)
    ]


@dataclass
class FilterCounts:
    """Pairs read, kept, and dropped per filter (a pair counts under the first it breaks;
    ``cross_entropy``, the last, is applied at the end)."""

    read: int = 0
    kept: int = 0
    empty: int = 0
    bad_ratio: int = 0
    copy: int = 0
    cross_entropy: int = 0

    def add(self, other: FilterCounts) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def filter_pairs(
    sources: list[str],
    outputs: list[str],
    src_lengths: list[int],
    out_lengths: list[int],
    settings: DistillConfig,
) -> tuple[list[int], FilterCounts]:
    """The positions of the pairs that pass the per-chunk filters, in order, and the counts.

    Args:
        sources, outputs: the source lines and their translations, aligned.
        src_lengths, out_lengths: their subword-token counts.
    """
    counts = FilterCounts(read=len(sources))
    kept = []
    for i, (src, out, ls, lo) in enumerate(
        zip(sources, outputs, src_lengths, out_lengths, strict=True)
    ):
        if not src.strip() or not out.strip():
            counts.empty += 1
        elif max(ls, lo) / max(min(ls, lo), 1) > float(settings.max_ratio):
            counts.bad_ratio += 1
        elif settings.drop_copies and _normal(src) == _normal(out):
            counts.copy += 1
        else:
            kept.append(i)
    counts.kept = len(kept)
    return kept, counts


def worst(scores: list[float], quantile: float) -> set[int]:
    """The positions of the ``floor(quantile * len(scores))`` highest `scores` (ties: the
    earlier line first): the pairs the cross-entropy filter drops."""
    k = math.floor(quantile * len(scores) + 1e-9)  # 0.29 * 100 is 28.999...
    return set(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k])


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` to a temporary file next to `path`, fsync, then rename it over `path`."""
    tmp = path.parent / f".{path.name}.tmp"
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _differs(old: dict[str, Any], new: dict[str, Any]) -> str:
    return ", ".join(sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)))


@dataclass
class DistillOutput:
    """The output directory's files and its resume state (module docstring)."""

    out: Path
    langs: tuple[str, str]
    settings: dict[str, Any]
    chunks: int = 0
    counts: FilterCounts = field(default_factory=FilterCounts)
    sizes: tuple[int, ...] = (0, 0, 0)
    """the byte lengths of `parts`"""

    def final(self, lang: str) -> Path:
        return self.out / f"train.{lang}"

    def part(self, lang: str) -> Path:
        return self.out / f"train.{lang}.part"

    def parts(self) -> list[Path]:
        """The source part, the translation part and the cross-entropy part (one per line)."""
        return [self.part(self.langs[0]), self.part(self.langs[1]), self.out / SCORES_PART]

    def finished(self) -> dict[str, Any] | None:
        """The provenance of a finished run with these settings (None: not finished).

        Raises:
            ConfigError: `out` holds a run with other settings, or files it did not write.
        """
        marker, provenance = self.out / MARKER_FILE, self.out / PROVENANCE_FILE
        if marker.is_file():
            state = json.loads(marker.read_text(encoding="utf-8"))
            self._check(state["settings"], "an unfinished distillation")
            self.chunks, self.counts = int(state["chunks"]), FilterCounts(**state["counts"])
            sizes = [int(b) for b in state["bytes"]]
            self.sizes = tuple(sizes + [0] * (len(self.parts()) - len(sizes)))  # older: 2 parts
            return None
        if provenance.is_file():
            done = json.loads(provenance.read_text(encoding="utf-8"))
            self._check(done["settings"], "a corpus distilled")
            return done
        self.refuse_foreign()
        return None

    def refuse_foreign(self) -> None:
        """Refuse an `out` holding corpus files that no distill run wrote (e.g. data.dir).

        Raises:
            ConfigError: ``train.{lang}`` or a part without the marker or the provenance.
        """
        if (self.out / MARKER_FILE).is_file() or (self.out / PROVENANCE_FILE).is_file():
            return
        found = [p.name for lang in self.langs for p in (self.final(lang), self.part(lang))]
        found = [name for name in found if (self.out / name).exists()]
        if found:
            raise ConfigError(
                f"{self.out} holds {', '.join(found)} but no {PROVENANCE_FILE}: not a distilled "
                "corpus; choose an empty out= directory"
            )

    def _check(self, old: dict[str, Any], what: str) -> None:
        if old != self.settings:
            raise ConfigError(
                f"{self.out} holds {what} with other settings (differs in: "
                f"{_differs(old, self.settings)}); rerun with those settings, or choose "
                "another out= directory"
            )

    def open_parts(self) -> None:
        """Create the parts, or cut them to the marker's lengths (a kill mid-chunk)."""
        self.out.mkdir(parents=True, exist_ok=True)
        for part, size in zip(self.parts(), self.sizes, strict=True):
            if size and not part.is_file():
                raise DataError(
                    f"{part} is missing but {MARKER_FILE} records {self.chunks} chunk(s); "
                    f"delete {self.out} to start over"
                )
            with part.open("ab") as f:
                f.truncate(size)
        self.save_marker()

    def save_marker(self) -> None:
        state = {
            "chunks": self.chunks,
            "bytes": list(self.sizes),
            "counts": asdict(self.counts),
            "settings": self.settings,
        }
        write_json(self.out / MARKER_FILE, state)

    def append(
        self,
        sources: list[str],
        outputs: list[str],
        cross_entropies: list[float],
        counts: FilterCounts,
    ) -> None:
        """Append one chunk's kept pairs and their cross-entropies to the parts (flushed),
        then move the marker."""
        sizes = []
        scores = [repr(float(x)) for x in cross_entropies]  # repr: read back exactly
        for part, lines in zip(self.parts(), (sources, outputs, scores), strict=True):
            with part.open("ab") as f:
                f.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
                sizes.append(f.tell())
        self.chunks += 1
        self.counts.add(counts)
        self.sizes = tuple(sizes)
        self.save_marker()

    def finish(
        self, provenance: dict[str, Any], ce_quantile: float | None = None
    ) -> dict[str, Any]:
        """Copy the parts to ``train.{lang}`` without the pairs the cross-entropy filter
        drops (`worst`; `ce_quantile` None = off), write the provenance, then remove the
        marker and the parts (a kill in between finishes again on the rerun)."""
        src, tgt, scores = self.parts()
        values = [float(x) for x in scores.read_text(encoding="utf-8").split()]
        drop = worst(values, float(ce_quantile)) if ce_quantile else set()
        self.counts.cross_entropy = len(drop)
        self.counts.kept -= len(drop)
        for part, lang in ((src, self.langs[0]), (tgt, self.langs[1])):
            _copy_lines(part, self.final(lang), drop)
        done = {**provenance, "settings": self.settings, "counts": asdict(self.counts)}
        write_json(self.out / PROVENANCE_FILE, done)
        (self.out / MARKER_FILE).unlink(missing_ok=True)
        for part in self.parts():
            part.unlink(missing_ok=True)
        return done


def _copy_lines(part: Path, final: Path, drop: set[int]) -> None:
    """`part`'s lines but those at the positions `drop`, into `final` (written beside it, then
    renamed over it)."""
    tmp = final.parent / f".{final.name}.tmp"
    with part.open("rb") as src, tmp.open("wb") as dst:  # binary: lines end at b"\n" only
        for i, line in enumerate(src):
            if i not in drop:
                dst.write(line)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, final)


Translate = Callable[[list[str]], tuple[list[list[Candidate]], list[int]]]
"""source lines -> (per line its `Candidate` hypotheses best first, per line its source subword
tokens)"""


def distill_corpus(
    chunks: Iterable[tuple[list[str], list[str]]],
    translate: Translate,
    output: DistillOutput,
    settings: DistillConfig,
    total: int | None,
) -> bool:
    """Translate the source `chunks` not yet done and append the kept pairs to `output`.

    Args:
        chunks: the split's (source lines, reference lines), ``settings.chunk_lines`` at a
            time (the same chunks on every run: the marker counts them).
        translate: source lines -> their candidates and source token counts (`Translate`).
        total: source lines in the split, for the ETA (None: unknown).

    Returns:
        True when every chunk is done, False when ``settings.max_chunks`` stopped the run.
    """
    todo: Iterator[tuple[list[str], list[str]]] = iter(chunks)
    for _ in range(output.chunks):  # done on an earlier run: read, not translated
        next(todo, None)
    done_now = 0
    with tqdm(
        total=total,
        initial=output.counts.read,
        disable=not settings.progress,
        file=sys.stderr,
        unit="sent",
        desc="distill",
        smoothing=0.1,
    ) as bar:
        for sources, references in todo:
            if settings.max_chunks is not None and done_now >= int(settings.max_chunks):
                log.info(
                    "stopped after %d chunk(s) (max_chunks); rerun the same command to continue",
                    done_now,
                )
                return False
            candidates, src_lengths = translate(sources)
            chosen = choose(candidates, references, settings.select)
            kept, counts = filter_pairs(
                sources, [c.text for c in chosen], src_lengths, [c.tokens for c in chosen],
                settings,
            )  # fmt: skip
            output.append(
                [sources[i] for i in kept],
                [chosen[i].text for i in kept],
                [chosen[i].cross_entropy for i in kept],
                counts,
            )
            done_now += 1
            bar.update(len(sources))
    return True


def log_counts(counts: FilterCounts, out: Path) -> None:
    """One line: pairs kept of read, and what each filter dropped."""
    log.info(
        "distilled %d of %d pairs into %s (dropped: %d empty, %d length ratio, %d copies, "
        "%d cross-entropy)",
        counts.kept,
        counts.read,
        out,
        counts.empty,
        counts.bad_ratio,
        counts.copy,
        counts.cross_entropy,
    )


__all__ = [
    "MARKER_FILE",
    "PROVENANCE_FILE",
    "SCORES_PART",
    "SELECT",
    "Candidate",
    "DistillConfig",
    "DistillOutput",
    "FilterCounts",
    "Translate",
    "choose",
    "distill_corpus",
    "filter_pairs",
    "log_counts",
    "worst",
]
