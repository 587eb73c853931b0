"""The score command: forced-decoding scores of (source, target) pairs (conf/score.yaml)."""

from __future__ import annotations

import io
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from omegaconf import DictConfig

from litmt.checkpoint.paths import checkpoint_paths
from litmt.data.text import read_text_file
from litmt.decoding.config import DecodeConfig
from litmt.decoding.forced import PairScore, Scorer
from litmt.errors import DataError


def format_score(result: PairScore) -> str:
    """``log_prob<TAB>score`` (6 decimals; ``-inf`` for pairs that cannot be produced)."""
    return f"{result.log_prob:.6f}\t{result.score:.6f}"


def score(cfg: DictConfig) -> list[PairScore]:
    """The `scripts/score.py` job: score `src_file` x `tgt_file` line by line.

    Writes one line ``log_prob<TAB>score`` per pair, in input order, to `output` (or stdout).

    Raises:
        DataError: a missing file, or the files differ in line count.
        ConfigError / CheckpointError: from the checkpoint arguments.
    """
    ckpt = checkpoint_paths(
        cfg.get("ckpt_path"), run_dir=cfg.get("run_dir"), average_last=cfg.get("average_last")
    )
    if not cfg.get("src_file") or not cfg.get("tgt_file"):
        raise DataError("pass src_file=FILE and tgt_file=FILE (one sentence per line, aligned)")
    sources = read_text_file(str(cfg.src_file), "src_file")
    targets = read_text_file(str(cfg.tgt_file), "tgt_file")
    if len(sources) != len(targets):
        raise DataError(
            f"src_file {cfg.src_file} has {len(sources)} lines but tgt_file {cfg.tgt_file} has "
            f"{len(targets)}; the files must align line by line"
        )
    scorer = Scorer.from_checkpoint(ckpt, device=cfg.get("device"), attention=cfg.get("attention"))
    results = scorer.score(
        sources,
        targets,
        length_penalty=DecodeConfig.from_options(cfg.decoding).length_penalty,  # null: the default
        max_tokens=int(cfg.max_tokens),
    )
    with ExitStack() as stack:
        out: IO[str]
        output = cfg.get("output")
        if output is not None:
            Path(str(output)).parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(Path(str(output)).open("w", encoding="utf-8", newline="\n"))
        else:
            out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
            stack.callback(out.detach)  # leave sys.stdout usable afterwards
            stack.callback(out.flush)
        for r in results:
            out.write(format_score(r) + "\n")
    return results
