"""Score sentence pairs with a trained checkpoint (forced decoding): one line per pair,
``log_prob<TAB>length-normalised score``, the numbers beam search ranks by.

    python scripts/score.py ckpt_path=model.ckpt src_file=test.en tgt_file=test.de
    python scripts/score.py ckpt_path=model.ckpt src_file=a.en tgt_file=a.de output=a.scores

See conf/score.yaml for every option and src/litmt/score.py for the exact definitions.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli
from litmt.config_check import check_command_line


@hydra.main(config_path="../conf", config_name="score", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.score import score  # after Hydra parsed the command line: fast --help

    score(cfg)


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
