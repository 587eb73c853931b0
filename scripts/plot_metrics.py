"""Plot a run's learning curve from its CSV log: training loss and validation BLEU vs step.

    python scripts/plot_metrics.py logs/multi30k_cpu/runs/RUN [--out curve.png] [--table]

`--table` also prints a markdown table of the validation metrics.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a training run directory")
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG path (default: <run_dir>/curve.png)"
    )
    parser.add_argument(
        "--table", action="store_true", help="print the validation metrics as markdown"
    )
    args = parser.parse_args()
    rows = read_metrics(args.run_dir)
    train = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
    valid = [r for r in rows if r.get("valid/bleu")]

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
    ax1.set_title(args.run_dir.name)
    fig.tight_layout()
    out = args.out or args.run_dir / "curve.png"
    fig.savefig(out)
    print(f"wrote {out}")
    if args.table:
        print("| epoch | step | valid loss | valid BLEU | valid chrF |")
        print("|---:|---:|---:|---:|---:|")
        for r in valid:
            print(
                f"| {r['epoch']} | {r['step']} | {float(r['valid/loss']):.3f} | "
                f"{float(r['valid/bleu']):.2f} | {float(r['valid/chrf']):.2f} |"
            )


if __name__ == "__main__":
    main()
