"""Train a translator: `python scripts/train.py [overrides]` (see conf/train.yaml)."""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    # main() returns valid/bleu: the value Hydra sweepers optimise
    run_script("train", "litmt.cli.train:train", stderr_logs=False, objective="valid/bleu")
