"""scripts/plot_metrics.py end to end: one run's curve and table, several runs' ablation plot."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from PIL import Image
from train_utils import REPO

SCRIPT = REPO / "scripts" / "plot_metrics.py"
FIELDS = ["epoch", "step", "train/loss", "valid/loss", "valid/bleu", "valid/chrf"]


def write_run(run: Path, bleus: list[float], steps_per_epoch: int) -> None:
    """A CSV log as Lightning's CSVLogger writes it: train rows, then one valid row per epoch."""
    out = run / "csv" / "version_0"
    out.mkdir(parents=True)
    with (out / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for epoch, bleu in enumerate(bleus):
            step = (epoch + 1) * steps_per_epoch
            w.writerow({"epoch": epoch, "step": step - 1, "train/loss": 5.0 - epoch})
            w.writerow(
                {
                    "epoch": epoch,
                    "step": step - 1,
                    "valid/loss": 4.0 - 0.1 * epoch,
                    "valid/bleu": bleu,
                    "valid/chrf": 2 * bleu,
                }
            )


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_one_run_writes_a_curve_and_its_table(tmp_path):
    write_run(tmp_path / "a", [10.0, 20.5, 19.0], 100)
    res = run(str(tmp_path / "a"), "--table")
    assert res.returncode == 0, res.stderr
    assert Image.open(tmp_path / "a" / "curve.png").size == (700, 400)
    rows = [line for line in res.stdout.splitlines() if line.startswith("| 1 |")]
    assert rows == ["| 1 | 199 | 3.900 | 20.50 | 41.00 |"]


def test_several_runs_share_a_time_axis_and_report_their_best(tmp_path):
    # run a: 4 epochs of 100 steps, best at epoch 3 (step 399 of 399 -> minute 58);
    # run b: 2 epochs of 300 steps, best at its first (step 299 of 599 -> minute 28.95)
    write_run(tmp_path / "a", [10.0, 20.0, 25.0, 30.0], 100)
    write_run(tmp_path / "b", [31.0, 29.0], 300)
    out = tmp_path / "ablation.png"
    res = run(str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "A", "B", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "| A | 4 | 30.00 | 58 |" in res.stdout
    assert "| B | 2 | 31.00 | 29 |" in res.stdout
    assert Image.open(out).size == (700, 400)


def test_each_run_may_have_its_own_budget(tmp_path):
    # a teacher of 58 minutes and a student of 29: each run's last step is its own budget
    write_run(tmp_path / "a", [10.0, 20.0, 25.0, 30.0], 100)
    write_run(tmp_path / "b", [31.0, 29.0], 300)
    out = tmp_path / "two.png"
    args = [str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "A", "B", "--out", str(out)]
    res = run(*args, "--budget-min", "58", "29")
    assert res.returncode == 0, res.stderr
    assert "| A | 4 | 30.00 | 58 |" in res.stdout
    assert "| B | 2 | 31.00 | 14 |" in res.stdout  # step 299 of 599 x 29
    res = run(*args, "--budget-min", "58", "29", "10")
    assert res.returncode == 2 and "--budget-min has 3 values for 2 runs" in res.stderr


def test_label_count_mismatch_and_missing_logs_are_one_line_errors(tmp_path):
    write_run(tmp_path / "a", [10.0], 10)
    res = run(str(tmp_path / "a"), str(tmp_path / "a"), "--labels", "only-one")
    assert res.returncode == 2 and "--labels has 1 names for 2 runs" in res.stderr
    res = run(str(tmp_path / "a"), str(tmp_path / "nothing"))
    assert res.returncode == 1
    assert res.stderr.strip().startswith("error: no csv/version_*/metrics.csv under")
