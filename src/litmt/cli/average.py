"""The average_checkpoints command: average checkpoints into one (conf/average_checkpoints.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from litmt.checkpoint.average import average_checkpoints
from litmt.checkpoint.paths import checkpoint_paths
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


def average(cfg: DictConfig) -> Path:
    """The `scripts/average_checkpoints.py` job: ``inputs=[...]`` or ``run_dir`` + ``average_last``."""
    if not cfg.get("output"):
        raise ConfigError("no output given: pass output=<path of the averaged .ckpt>")
    inputs, average_last = cfg.get("inputs"), cfg.get("average_last")
    if inputs and average_last:
        raise ConfigError("give either inputs=[...] or run_dir=DIR average_last=N, not both")
    if not (inputs or average_last):
        raise ConfigError(
            "nothing to average: pass inputs=[a.ckpt,b.ckpt] or run_dir=DIR average_last=N"
        )
    paths = checkpoint_paths(inputs, run_dir=cfg.get("run_dir"), average_last=average_last)
    out = average_checkpoints(paths, cfg.output)
    log.info("averaged %d checkpoint(s) → %s", len(paths), out)
    return out
