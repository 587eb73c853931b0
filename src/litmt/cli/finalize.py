"""The finalize command: rerun the end-of-training step on a finished run directory (conf/finalize.yaml)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from litmt.checkpoint.io import load_checkpoint
from litmt.config import build, job_config
from litmt.errors import ConfigError
from litmt.records import write_record
from litmt.training.finalize import check_finalize_config, finalize, summary_lines
from litmt.training.finalize_report import run_record


@dataclass(frozen=True)
class FinalizeOverrides:
    """The finalize keys a rerun may change; null = the run's own value (its
    .hydra/config.yaml), else this one."""

    average_best: int | None = None
    """average the N checkpoints with the best valid BLEU"""
    beam_sizes: list[int] | None = None
    """beam sizes tried on valid"""
    length_penalties: list[float] | None = None
    """length penalties tried on valid with each beam size"""
    max_tokens: int | None = None
    """tokens per decoding batch"""
    record: str | None = None
    """also write the result record docs/results/records/<record>.json (run from the
    repository root; the results page is generated from the records)"""


@dataclass(frozen=True)
class FinalizeConfig:
    """The finalize command's keys (conf/finalize.yaml)."""

    run_dir: str | None = None
    """a training run directory: .hydra/config.yaml and checkpoints/last.ckpt (required)"""
    data_dir: str | None = None
    """the corpus directory if it moved since training (null = the run's data.dir)"""
    extra_test: list[str] | None = None
    """more test splits to score, e.g. [test_2017_flickr, test_2017_mscoco] (null = the run's
    data.extra_test)"""
    finalize: FinalizeOverrides = field(default_factory=FinalizeOverrides)
    """null = the run's own value (its .hydra/config.yaml), else this one"""


def kept_checkpoints(last_ckpt: Path) -> dict[str, float]:
    """{path: valid BLEU} of the top-k `ModelCheckpoint` kept, from the state in `last_ckpt`.

    Raises:
        CheckpointError: `last_ckpt` is corrupt or not a litmt checkpoint (`load_checkpoint`,
        the one safe reader).
    """
    state = load_checkpoint(last_ckpt).get("callbacks", {})
    kept: dict[str, float] = {}
    for key, value in state.items():
        if key.startswith("ModelCheckpoint") and isinstance(value, Mapping):
            kept.update({str(p): float(s) for p, s in value.get("best_k_models", {}).items()})
    return {p: s for p, s in kept.items() if Path(p).is_file()}


def finalize_run(cfg: DictConfig) -> dict[str, Any]:
    """`scripts/finalize.py`: `finalize` on a finished run directory, printing the final lines.

    The run's own config (``<run_dir>/.hydra/config.yaml``) gives the data and the `finalize`
    block; non-null keys of ``cfg.finalize`` replace the run's. The checkpoints and their
    valid BLEU come from the `ModelCheckpoint` state in ``checkpoints/last.ckpt``.

    Raises:
        ConfigError: no run_dir, or it lacks the saved config or last.ckpt or kept checkpoints.
    """
    values = {k: cfg[k] for k in ("run_dir", "data_dir", "extra_test") if k in cfg}
    overrides = build(FinalizeOverrides, cfg.get("finalize"), "finalize.finalize")
    settings = dataclasses.replace(
        job_config(FinalizeConfig, values, "finalize"), finalize=overrides
    )
    if not settings.run_dir:
        raise ConfigError("run_dir is required: python scripts/finalize.py run_dir=RUN_DIR")
    run = Path(settings.run_dir)
    saved, last = run / ".hydra" / "config.yaml", run / "checkpoints" / "last.ckpt"
    for path, what in ((saved, "the run's saved config"), (last, "last.ckpt")):
        if not path.is_file():
            raise ConfigError(f"{path} not found: run_dir must be a training run ({what})")
    train_cfg = OmegaConf.load(saved)
    given = {k: v for k, v in dataclasses.asdict(overrides).items() if v is not None}
    with open_dict(train_cfg):
        train_cfg.paths.output_dir = str(run)
        if settings.data_dir:
            train_cfg.data.dir = str(settings.data_dir)
        if settings.extra_test is not None:
            train_cfg.data.extra_test = list(settings.extra_test)
        train_cfg.finalize = OmegaConf.merge(train_cfg.get("finalize") or {}, given)
    check_finalize_config(train_cfg)
    kept = kept_checkpoints(last)
    if not kept:
        raise ConfigError(f"{last} lists no kept checkpoint that still exists in {last.parent}")
    best = max(kept, key=kept.__getitem__)
    return run_finalize(train_cfg.finalize, instantiate(train_cfg.data), kept, best, run)


def run_finalize(
    fin: DictConfig, datamodule: Any, kept: Mapping[str, Any], best: str, output_dir: Path
) -> dict[str, Any]:
    """`finalize` on `datamodule`'s scored corpora (one per direction of a multilingual run)
    and extra test splits; prints the summary lines and returns the report.

    The end of `litmt.cli.train.train` and of `finalize_run` (scripts/finalize.py).
    """
    report = finalize(
        fin,
        best_k_models=kept,
        best=best,
        corpus=datamodule.scored_corpora(),
        output_dir=output_dir,
        extra_test=datamodule.extra_test,
    )
    for line in summary_lines(report):
        print(line)
    if record_id := fin.get("record"):
        path = write_record(run_record(output_dir, report, str(record_id)))
        print(f"result record: {path}")
    return report
