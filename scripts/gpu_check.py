"""The measurements of `scripts/gpu_check.sh`, most valuable first, without Hydra.

The GPU image has CUDA PyTorch, Lightning (with PyYAML), sentencepiece and sacreBLEU, and no
hydra-core, omegaconf, `datasets` or wandb. So this script imports none of them: it reads the
Multi30k text files into litmt's `TokenizedPairs`, batches them with `TokenBudgetBatchSampler`
and `collate`, builds `TranslationModule` and a Lightning `Trainer` directly, and reads the
model sizes, the optimiser and the CPU recipe from `conf/` with PyYAML (no values restated).

    PYTHONPATH=src python3 scripts/gpu_check.py --out OUT [--data data/multi30k] [--deadline-s 330]
    PYTHONPATH=src python3 scripts/gpu_check.py --dry-run --out OUT   # CPU, toy corpus, seconds

Rows, in this order (a deadline cuts the least valuable):
  1. environment; flash/xformers/te: version, "not installed" or "not usable: <why>" (the
     package is imported with every name its backend calls; its rows are then skipped);
     the corpus (tokenizer trained once, then cached in OUT);
  2. loss parity: sdpa (the reference), math, flex (and flash/xformers/te where usable) in
     bf16-mixed and 16-mixed: `--steps` steps from one seed on the same batches, no dropout;
     the mean loss of the last 20 steps within `LOSS_TOLERANCE` (2 %) of sdpa's. A flex run
     whose compile fell back to eager flex is a FAIL ("compiled flex fell back to eager");
  3. the bf16 matmul peak (a plain 8192^3 matmul), then Transformer-base bf16 training target
     tokens/s and MFU against that measured peak;
  4. flex against sdpa speed: steady-state tokens/s of the bf16 parity runs (no extra run);
  5. the CPU recipe's model (conf/experiment/multi30k_cpu.yaml) trained `--bleu-train-s`
     seconds in bf16, then beam 5 on test2016: BLEU and sentences/s;
  6. one-GPU FSDP (and FP8 where Transformer Engine is usable), each in its own process.
Every row is planned first (OUT/gpu_check_plan.jsonl) and measured in its own guard: an
exception becomes that row's FAIL with the error's type and message, and the later rows
still run. Each row gives the peak CUDA memory of its step and is appended to
OUT/gpu_check_rows.jsonl as soon as it is measured; the row being measured is named in
OUT/gpu_check_current.txt (so a killed run says where it stopped). Missing data, a run cut
by its cap or the deadline, a parity miss and an error are FAIL rows; the exit status is 1
when any row failed.

Budget at the defaults (estimates for one H100/H200-class GPU; no measured number yet).
`gpu_check.sh --deadline-s 480` keeps --tests-s 90 + 10 s for the gpu tests and the table,
so this script runs with --deadline-s 370 (and is killed at 380):

    environment and corpus (sentencepiece on Multi30k)          15 s
    parity sdpa, math in bf16 and fp16: 4 runs x ~10 s           40 s
    parity flex in bf16 and fp16: 2 runs x ~10 s of steps        20 s
      + the flex compile allowance (--flex-compile-s)            90 s
    matmul peak and Transformer-base throughput                  20 s
    recipe BLEU: --bleu-train-s 120 + ~20 s of beam 5           140 s
    FSDP, 1 GPU, in its own process                              30 s
    margin kept free before the deadline                         15 s
                                                          total 370 s

Each parity run stops at --run-cap-s (60 s; then its row is a FAIL) so a slow kernel cannot
eat the rows after it. flex compiles its kernels (forward and backward, per batch-shape
bucket and per dtype) in its first steps, cold on this machine, which can take longer than a
whole run of the other kernels: a flex run may take --run-cap-s plus what is left of the
allowance, and its time beyond its steps at their median pace (start-up and compiling) is
taken from it, so the bf16 run (the cold one) can compile for about 50 + 90 s and the fp16 run
gets the rest; the parity row shows that time. If the estimates run over, the deadline cuts
the last rows (FSDP first, then the recipe), each a FAIL row; the recipe starts only with
--bleu-train-s + 25 s left, FSDP with 45 s.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from gpu_check_common import (
    EXACT,
    FILES,
    PACKAGES,
    RECIPE,
    ROOT,
    TINY,
    Deadline,
    State,
    merge,
    model_group,
    write_toy_corpus,
)
from gpu_check_kernels import corpus, environment, flex_speed, kernel_package, parity
from gpu_check_rows import Measure, Rows
from gpu_check_training import (
    WORKER_CHECKS,
    matmul_peak,
    recipe_bleu,
    run_worker,
    throughput,
    worker,
)

Planned = list[tuple[str, str, Measure]]


def plan(st: State) -> Planned:
    """Every row of this run, in order: (check, setting, measure)."""
    args = st.args
    rows: Planned = [("environment", "-", partial(environment, st))]
    rows += [
        ("kernel package", pkg, partial(kernel_package, b, pkg)) for b, pkg in PACKAGES.items()
    ]
    n, dtype = args.matmul_n, "bfloat16" if args.accelerator == "gpu" else "float32"
    matmul = f"{dtype} {n}x{n}x{n}, {args.matmul_reps} reps"
    absent = [f for f in FILES if not (args.data / f).is_file()]
    if absent:
        fix = "fill it with: bash scripts/gpu_check.sh --prepare-data"
        missing = (f"missing {', '.join(absent)}; {fix}", "FAIL")
        return [*rows, ("data", str(args.data), lambda: missing),
                ("matmul peak", matmul, partial(matmul_peak, st))]  # fmt: skip
    rows.append(("corpus", f"{args.data}, vocab {args.vocab_size}", partial(corpus, st)))
    precisions = ("bf16-mixed", "16-mixed") if args.accelerator == "gpu" else ("bf16-mixed",)
    for precision in precisions:
        for backend in args.backends:
            setting = f"{backend} {precision}, {args.steps} steps"
            rows.append(("loss parity", setting, partial(parity, st, backend, precision)))
    base = f"{args.base_name}, bf16, sdpa, max_tokens {args.base_max_tokens}"
    base += f", {args.base_steps} steps"
    speed = f"bf16-mixed parity runs, steps after the first {args.speed_skip}"
    recipe = f"multi30k_cpu model, bf16-mixed, {args.bleu_train_s:.0f}s, beam 5 on test2016"
    rows += [
        ("matmul peak", matmul, partial(matmul_peak, st)),
        ("throughput", base, partial(throughput, st)),
        ("flex vs sdpa speed", speed, partial(flex_speed, st)),
        ("recipe BLEU", recipe, partial(recipe_bleu, st)),
    ]
    for kind, check in WORKER_CHECKS.items():
        precision = "bf16-mixed" if kind == "fsdp" else "fp8"
        rows.append(
            (check, f"{precision}, {args.worker_steps} steps", partial(run_worker, st, kind))
        )
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="The measurements of scripts/gpu_check.sh (see the module docstring)."
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the rows, logs, checkpoints")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "multi30k",
                   help="Multi30k train/test2016 .en/.de (default data/multi30k)")  # fmt: skip
    p.add_argument(
        "--deadline-s", type=float, default=330.0, help="wall-clock limit of this script"
    )
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of each parity run")
    p.add_argument("--run-cap-s", type=float, default=60.0,
                   help="the longest one parity run may take (then it is a FAIL)")  # fmt: skip
    p.add_argument("--flex-compile-s", type=float, default=90.0,
                   help="compile allowance of the flex parity runs (shared), on top of "
                   "--run-cap-s; see the budget in the module docstring")  # fmt: skip
    p.add_argument(
        "--bleu-train-s", type=float, default=120.0, help="training time of the recipe row"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="CPU, a toy corpus, a tiny model: seconds"
    )
    p.add_argument("--inject-failure", metavar="ROW",
                   help="dry run only: the row whose 'check | setting' starts with ROW raises "
                   "inside its guard (e.g. 'throughput'), to test that the table keeps every "
                   "row")  # fmt: skip
    p.add_argument("--inject-crash", metavar="ROW",
                   help="dry run only: the process exits (status 70) when it reaches ROW, as a "
                   "crash would; gpu_check.sh must then report every row not written")  # fmt: skip
    p.add_argument("--worker", choices=("fp8", "fsdp"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for flag, value in (
        ("--inject-failure", args.inject_failure),
        ("--inject-crash", args.inject_crash),
    ):
        if value is not None and not args.dry_run:
            p.error(f"{flag} is for the dry run only (add --dry-run)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.margin_s = 15.0  # seconds kept free before the deadline for the row and the table
    args.speed_skip = 10  # parity steps left out of the speed figure (flex compiles in them)
    args.worker_steps = 50
    args.recipe_size = merge(model_group("small"), RECIPE["model"])
    args.vocab_size = RECIPE["data"]["tokenizer"]["vocab_size"]
    args.recipe_max_tokens = RECIPE["data"]["max_tokens"]
    if args.dry_run:
        args.data = write_toy_corpus(args.out / "toy-data")
        args.accelerator, args.vocab_size, args.margin_s = "cpu", 64, 2.0
        args.size = args.base_size = args.recipe_size = {**model_group("base"), **TINY}
        args.base_name, args.max_tokens, args.base_max_tokens = "tiny", 256, 256
        args.steps, args.base_steps, args.speed_skip = min(args.steps, 3), 2, 0
        args.bleu_train_s, args.recipe_max_tokens = min(args.bleu_train_s, 2.0), 256
        args.matmul_n, args.matmul_reps, args.backends = 128, 3, ("sdpa", "math")
    else:
        args.accelerator, args.size = "gpu", model_group("small")
        args.base_size, args.base_name = model_group("base"), "base"
        args.max_tokens, args.base_max_tokens, args.base_steps = 4096, 8192, 30
        args.matmul_n, args.matmul_reps, args.backends = 8192, 20, EXACT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        worker(args.worker, args)
        return 0
    rows = Rows(args.out, inject=args.inject_failure, crash=args.inject_crash)
    st = State(args, rows, Deadline(args.deadline_s))
    st.flex_compile_left = args.flex_compile_s
    st.rows.run(plan(st))
    return 1 if st.rows.failed else 0


if __name__ == "__main__":
    sys.exit(main())
