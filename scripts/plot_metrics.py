"""Plot a run's learning curve from its CSV log: training loss and validation BLEU vs step.

    python scripts/plot_metrics.py logs/multi30k_cpu/runs/RUN [--out curve.png] [--table]
    python scripts/plot_metrics.py RUN_A RUN_B --labels "recipe A" "recipe B" --budget-min 58
    python scripts/plot_metrics.py TEACHER STUDENT --labels teacher student --budget-min 58 29

`--table` also prints a markdown table of the validation metrics. With several runs (an
ablation), it draws their validation BLEU on one axis against training time, taken as
step / final step x `--budget-min` (each run's `trainer.max_time` in minutes: one value for
all, or one per run), and prints each run's best validation BLEU.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    """Rows of `<run_dir>/csv/version_*/metrics.csv` (the latest version)."""
    files = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    if not files:
        raise SystemExit(
            f"error: no csv/version_*/metrics.csv under {run_dir} (was logger=csv or default used?)"
        )
    with files[-1].open() as f:
        return list(csv.DictReader(f))


def valid_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows that carry a validation BLEU."""
    return [r for r in rows if r.get("valid/bleu")]


def plot_one(run_dir: Path, out: Path | None, table: bool) -> None:
    """Training loss and validation BLEU of one run against the optimizer step."""
    rows = read_metrics(run_dir)
    train = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
    valid = valid_rows(rows)

    fig, ax1 = plt.subplots(figsize=(7, 4), dpi=100)
    ax1.plot(*zip(*train, strict=True), color="tab:blue", lw=1, label="train loss")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("train loss (label-smoothed)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(
        [int(r["step"]) for r in valid],
        [float(r["valid/bleu"]) for r in valid],
        "o-",
        color="tab:red",
    )
    ax2.set_ylabel("valid BLEU (greedy)", color="tab:red")
    ax1.set_title(run_dir.name)
    fig.tight_layout()
    out = out or run_dir / "curve.png"
    fig.savefig(out)
    print(f"wrote {out}")
    if table:
        print("| epoch | step | valid loss | valid BLEU | valid chrF |")
        print("|---:|---:|---:|---:|---:|")
        for r in valid:
            print(
                f"| {r['epoch']} | {r['step']} | {float(r['valid/loss']):.3f} | "
                f"{float(r['valid/bleu']):.2f} | {float(r['valid/chrf']):.2f} |"
            )


def plot_many(runs: list[Path], labels: list[str], out: Path, budgets: list[float]) -> None:
    """Validation BLEU of several runs against training time (step share of each run's
    budget in minutes, `budgets`: one per run)."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    print("| run | validations | best valid BLEU (greedy) | at minute |")
    print("|---|---:|---:|---:|")
    for run_dir, label, budget_min in zip(runs, labels, budgets, strict=True):
        rows = read_metrics(run_dir)
        valid = valid_rows(rows)
        if not valid:
            raise SystemExit(f"error: {run_dir} has no validation BLEU in its CSV log")
        last_step = max(int(r["step"]) for r in rows if r.get("step"))
        minutes = [int(r["step"]) / last_step * budget_min for r in valid]
        bleu = [float(r["valid/bleu"]) for r in valid]
        ax.plot(minutes, bleu, "o-", ms=3, label=label)
        best = max(range(len(bleu)), key=bleu.__getitem__)
        print(f"| {label} | {len(bleu)} | {bleu[best]:.2f} | {minutes[best]:.0f} |")
    shown = " / ".join(f"{b:g}" for b in dict.fromkeys(budgets))
    ax.set_xlabel(f"training time, minutes (step / final step x the run's budget: {shown})")
    ax.set_ylabel("valid BLEU (greedy)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="training run directories")
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG path (default: <run_dir>/curve.png)"
    )
    parser.add_argument(
        "--table", action="store_true", help="print the validation metrics as markdown"
    )
    parser.add_argument(
        "--labels", nargs="+", default=None, help="legend labels, one per run (several runs)"
    )
    parser.add_argument(
        "--budget-min",
        type=float,
        nargs="+",
        default=[58.0],
        help="minutes of training (trainer.max_time) of the runs, for the time axis: one value "
        "for all, or one per run (several runs)",
    )
    args = parser.parse_args()
    if len(args.run_dirs) == 1:
        plot_one(args.run_dirs[0], args.out, args.table)
        return
    labels = args.labels or [p.name for p in args.run_dirs]
    if len(labels) != len(args.run_dirs):
        parser.error(f"--labels has {len(labels)} names for {len(args.run_dirs)} runs")
    budgets = args.budget_min * len(labels) if len(args.budget_min) == 1 else args.budget_min
    if len(budgets) != len(args.run_dirs):
        parser.error(f"--budget-min has {len(budgets)} values for {len(args.run_dirs)} runs")
    plot_many(args.run_dirs, labels, args.out or Path("ablation.png"), budgets)


if __name__ == "__main__":
    main()
