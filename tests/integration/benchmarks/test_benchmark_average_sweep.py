"""reports/average_sweep.py: which checkpoints each choice averages, and a real run's table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_checkpoint, corpus, other_weights

from litmt.errors import LitmtError
from reports.average_sweep import run_checkpoints, strategies

REPO = Path(__file__).resolve().parents[3]


def fake(n: int) -> list[tuple[int, float, Path]]:
    """n per-epoch checkpoints, step 100 * epoch, BLEU rising then falling (peak at epoch 7)."""
    return [(100 * e, 30.0 - abs(e - 7), Path(f"e{e}.ckpt")) for e in range(1, n + 1)]


def epochs(chosen: list[tuple[int, float, Path]]) -> list[int]:
    return [step // 100 for step, _, _ in chosen]


def test_each_choice_takes_the_checkpoints_its_name_says():
    s = strategies(fake(10))
    assert epochs(s["best"]) == [7]
    assert sorted(epochs(s["top-3"])) == [6, 7, 8]
    assert epochs(s["last-3"]) == [8, 9, 10]
    assert epochs(s["last-5/2"]) == [2, 4, 6, 8, 10]
    assert epochs(s["last-4/3"]) == [1, 4, 7, 10]


def test_choices_that_need_more_checkpoints_than_the_run_kept_are_left_out():
    s = strategies(fake(3))
    assert set(s) == {"best", "top-2", "top-3", "last-2", "last-3"}


def test_a_run_without_per_epoch_checkpoints_is_refused_with_the_fix(tmp_path: Path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best-step000100-bleu10.00.ckpt").write_bytes(b"")
    with pytest.raises(LitmtError, match="save_top_k=-1"):
        run_checkpoints(tmp_path)


@pytest.mark.slow
def test_the_table_ranks_a_trained_checkpoint_above_its_averages_with_random_weights(
    tmp_path: Path,
):
    trained = build_tiny_checkpoint(tmp_path / "tiny", steps=120)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    trained.rename(run / "best-step000300-bleu50.00.ckpt")
    other_weights(run / "best-step000300-bleu50.00.ckpt", run / "best-step000100-bleu1.00.ckpt", 1)
    other_weights(run / "best-step000300-bleu50.00.ckpt", run / "best-step000200-bleu2.00.ckpt", 2)
    en, de = corpus(seed=3)
    (tmp_path / "v.en").write_text("\n".join(en[:24]) + "\n")
    (tmp_path / "v.de").write_text("\n".join(de[:24]) + "\n")
    cmd = [sys.executable, "-m", "reports.average_sweep", str(tmp_path / "run"),
           "--valid-src", str(tmp_path / "v.en"), "--valid-ref", str(tmp_path / "v.de")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True, cwd=REPO)
    rows = {
        r.split(" | ")[0].strip("| "): r.strip("| ").split(" | ")
        for r in out.stdout.splitlines()
        if r.startswith("| ") and not r.startswith("| averaged")
    }
    assert set(rows) == {"best", "top-2", "top-3", "last-2", "last-3"}
    assert rows["best"][1] == "3" and rows["last-2"][1] == "2,3"
    bleu = {name: float(r[2]) for name, r in rows.items()}
    assert bleu["best"] > 20.0
    assert all(bleu["best"] > bleu[name] for name in ("top-2", "top-3", "last-2", "last-3"))
