"""Average the weights of several checkpoints (one run) into one self-contained checkpoint.

    python scripts/average_checkpoints.py 'ckpt_path=[a.ckpt,b.ckpt]' output=avg.ckpt
    python scripts/average_checkpoints.py run_dir=logs/train/runs/RUN average_last=5 output=avg.ckpt

evaluate.py averages on the fly too: ``ckpt_path=[a.ckpt,b.ckpt]`` or ``average_last=N``.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("average_checkpoints", "litmt.cli.average:average")
