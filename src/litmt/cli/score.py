"""The score command: forced decoding of (source, target) pairs (conf/score.yaml).

The command keeps the name users type (``scripts/score.py``); the library calls it forced
decoding (`litmt.decoding.analysis.forced.ForcedDecoder`), and the "score" it prints is the ranking
score of `Hypothesis.score`.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from litmt.config import job_config
from litmt.data.text import open_output, read_text_file
from litmt.decoding.analysis.forced import ForcedDecoder, PairScore
from litmt.decoding.config import DecodeConfig
from litmt.deploy.loader import LoadConfig, load_translator
from litmt.errors import DataError


@dataclass(frozen=True)
class ScoreConfig:
    """The score command's own keys (conf/score.yaml's top level; the checkpoint is the load
    group's, the length penalty the decoding group's)."""

    src_file: str | None = None
    """sources, one per line (UTF-8)"""
    tgt_file: str | None = None
    """targets, one per line, aligned with src_file"""
    output: str | None = None
    """write the scores to this file; null = stdout"""
    max_tokens: int = 4096
    """per batch: pairs x max(source, target + 1) subwords, padding included"""


def format_score(result: PairScore) -> str:
    """``log_prob<TAB>score`` (6 decimals; ``-inf`` for pairs that cannot be produced)."""
    return f"{result.log_prob:.6f}\t{result.score:.6f}"


def score(cfg: DictConfig) -> list[PairScore]:
    """The `scripts/score.py` job: force-decode `src_file` x `tgt_file` line by line.

    Writes one line ``log_prob<TAB>score`` per pair, in input order, to `output` (or stdout).

    Raises:
        DataError: a missing file, or the files differ in line count.
        ConfigError / CheckpointError: from the checkpoint arguments.
    """
    settings = job_config(ScoreConfig, cfg, "score")
    load = LoadConfig.from_cfg(cfg, "score", ignores=("ensemble",))
    ckpt = load.paths()
    if not settings.src_file or not settings.tgt_file:
        raise DataError("pass src_file=FILE and tgt_file=FILE (one sentence per line, aligned)")
    sources = read_text_file(str(settings.src_file), "src_file")
    targets = read_text_file(str(settings.tgt_file), "tgt_file")
    if len(sources) != len(targets):
        raise DataError(
            f"src_file {settings.src_file} has {len(sources)} lines but tgt_file "
            f"{settings.tgt_file} has {len(targets)}; the files must align line by line"
        )
    translator = load_translator(ckpt, engine="torch", device=load.device, attention=load.attention)
    results = ForcedDecoder(translator).force_decode(
        sources,
        targets,
        length_penalty=DecodeConfig.from_options(cfg.decoding).length_penalty,
        max_tokens=int(settings.max_tokens),
        **load.direction(),
    )
    output = settings.output
    with open_output(None if output is None else str(output)) as out:
        for r in results:
            out.write(format_score(r) + "\n")
    return results
