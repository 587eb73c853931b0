"""Average the weights of several checkpoints (one run) into one self-contained checkpoint.

    python scripts/average_checkpoints.py 'inputs=[a.ckpt,b.ckpt]' output=avg.ckpt
    python scripts/average_checkpoints.py run_dir=logs/train/runs/RUN average_last=5 output=avg.ckpt

evaluate.py averages on the fly too: ``ckpt_path=[a.ckpt,b.ckpt]`` or ``average_last=N``.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli


@hydra.main(config_path="../conf", config_name="average_checkpoints", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.evaluate import average

    average(cfg)


if __name__ == "__main__":
    main()
