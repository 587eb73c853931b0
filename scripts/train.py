"""Train a translator: `python scripts/train.py [overrides]` (see conf/train.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import run_cli
from litmt.config_check import check_command_line
from litmt.train import train


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get("valid/bleu")  # the value Hydra sweepers optimise


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
