"""The average_checkpoints command: average checkpoints into one (conf/average_checkpoints.yaml)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from litmt.checkpoint.average import average_checkpoints
from litmt.config import job_config, renamed_keys
from litmt.deploy.loader import WEIGHTS_ONLY_IGNORES, LoadConfig
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

# average_checkpoints.yaml keys that changed their name: the old spelling works for one release.
RENAMES = {"inputs": "ckpt_path"}


@dataclass(frozen=True)
class AverageConfig:
    """The average_checkpoints command's own key (conf/average_checkpoints.yaml's top level; the
    checkpoints are the load group's ``ckpt_path`` or ``run_dir`` + ``average_last``)."""

    output: str | None = None
    """path of the averaged checkpoint (required)"""


def average(cfg: DictConfig) -> Path:
    """The `scripts/average_checkpoints.py` job: ``ckpt_path=[...]`` or ``run_dir`` +
    ``average_last`` (conf/load/default.yaml); ``inputs=[...]`` is the old name of ``ckpt_path``.
    """
    settings = job_config(AverageConfig, cfg, "average_checkpoints")
    if not settings.output:
        raise ConfigError("no output given: pass output=<path of the averaged .ckpt>")
    given = {key: cfg.get(key) for key in ("inputs", "ckpt_path")}
    given = renamed_keys({k: v for k, v in given.items() if v}, RENAMES, "average_checkpoints")
    load = LoadConfig.from_cfg(
        {**cfg, **given}, "average_checkpoints", ignores=WEIGHTS_ONLY_IGNORES
    )
    if not (load.ckpt_path or load.average_last):
        raise ConfigError(
            "nothing to average: pass ckpt_path=[a.ckpt,b.ckpt] or run_dir=DIR average_last=N"
        )
    paths = load.paths()
    out = average_checkpoints(paths, settings.output)
    log.info("averaged %d checkpoint(s) → %s", len(paths), out)
    return out
