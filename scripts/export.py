"""Export a checkpoint to a CTranslate2 model directory (int8 and other quantizations).

    python scripts/export.py ckpt_path=model.ckpt out=exports/en-de
    python scripts/export.py ckpt_path=model.ckpt out=exports/en-de-int8 quantization=int8

See conf/export.yaml for every option.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli
from litmt.config_check import check_command_line


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.export import export  # after Hydra parsed the command line: fast --help

    print(export(cfg))


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
