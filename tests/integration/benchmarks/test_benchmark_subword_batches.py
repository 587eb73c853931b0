"""reports/subword_batches.py on a toy corpus: the table has a before and a now row per
setting, and no "now" batch exceeds the budget while the first draws did."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_corpora import write_multi

from reports.subword_batches import SETTINGS, main


@pytest.mark.slow
def test_the_table_shows_no_planned_batch_over_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_multi(tmp_path / "toy", {"train": 300, "valid": 10, "test2016": 10})
    argv = ["--dir", str(corpus), "--limit", "300", "--max-tokens", "200", "--vocab-size", "1000"]
    assert main(argv) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()]
    rows = [
        [c.strip() for c in r] for r in rows if len(r) == 9 and r[3].strip() in {"before", "now"}
    ]
    assert len(rows) == 2 * len(SETTINGS)
    now = [r for r in rows if r[3] == "now"]
    before = [r for r in rows if r[3] == "before"]
    assert all(r[7] == "0 %" and float(r[6]) <= 1.0 for r in now)
    assert any(float(r[6]) > 1.0 for r in before)  # the first draws overflowed
