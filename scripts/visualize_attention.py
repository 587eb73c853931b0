"""Save attention heatmaps (cross, encoder self, decoder self) of one sentence as PNG.

    python scripts/visualize_attention.py ckpt_path=model.ckpt sentence="A man is walking." \
        kind=cross layers=[-1] grid=true out=attn.png

See conf/visualize_attention.yaml for every option.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from litmt.cli import log_to_stderr, run_cli


@hydra.main(config_path="../conf", config_name="visualize_attention", version_base="1.3")
@run_cli
def main(cfg: DictConfig) -> None:
    log_to_stderr()
    from litmt.visualize import visualize

    visualize(cfg)


if __name__ == "__main__":
    main()
