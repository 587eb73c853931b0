"""Serve a model over HTTP: the LibreTranslate API and the attention explorer page.

    python scripts/serve.py model_path=model.ckpt port=5000
    python scripts/serve.py model_path=exports/en-de-int8 threads=2

See conf/serve.yaml for every option.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli
from litmt.config_check import check_command_line


@hydra.main(config_path="../conf", config_name="serve", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.serve import serve  # after Hydra parsed the command line: fast --help

    serve(cfg)


if __name__ == "__main__":
    check_command_line()  # an unknown config group option: one line, exit 2
    main()
