"""Run the end-of-training step again on a finished run: average the best checkpoints, choose
beam size and length penalty on valid, score test, write ``<run_dir>/scores.json``.

    python scripts/finalize.py run_dir=logs/multi30k_cpu/runs/RUN
    python scripts/finalize.py run_dir=RUN finalize.average_best=3 "finalize.beam_sizes=[1,4,8]"
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("finalize", "litmt.cli.finalize:finalize_run")
