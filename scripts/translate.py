"""Translate sentences with a trained checkpoint (stdin → stdout by default).

    echo "A man is walking." | python scripts/translate.py ckpt_path=model.ckpt
    python scripts/translate.py ckpt_path=model.ckpt input=test.en output=test.hyp beam_size=5
    python scripts/translate.py ckpt_path=model.ckpt 'text=["A man.", "A dog."]' n_best=3

See conf/translate.yaml for every option.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli
from litmt.config_check import check_command_line


@hydra.main(config_path="../conf", config_name="translate", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.translate import translate  # after Hydra parsed the command line: fast --help

    translate(cfg)


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
