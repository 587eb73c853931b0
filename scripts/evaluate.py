"""Score a checkpoint with sacreBLEU BLEU, chrF and TER.

    python scripts/evaluate.py ckpt_path=model.ckpt src_file=test.en ref_file=test.de \
        hyp_file=test.hyp beam_size=5
    python scripts/evaluate.py 'ckpt_path=[a.ckpt,b.ckpt]' data=multi30k split=test
    python scripts/evaluate.py run_dir=logs/train/runs/RUN average_last=5 data=multi30k

See conf/evaluate.yaml for every option.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli
from litmt.config_check import check_command_line


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.evaluate import evaluate

    evaluate(cfg)


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
