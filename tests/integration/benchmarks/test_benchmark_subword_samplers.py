"""benchmarks/subword_samplers.py on a toy corpus: a row per sampler, and litmt's seeded
n-best sampler repeats its segmentations in a new process while sentencepiece's does not
promise to (its rows are printed, not asserted: that is sentencepiece's behaviour)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_corpora import write_multi

from benchmarks.subword_samplers import ROWS, main


@pytest.mark.slow
def test_the_seeded_rows_repeat_in_a_new_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_multi(tmp_path / "toy", {"train": 300, "valid": 10, "test2016": 10})
    assert main(["--dir", str(corpus), "--n", "100", "--vocab-size", "80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {r[0]: r[1:] for r in ([c.strip() for c in line.split("|")[1:-1]] for line in lines)
            if len(r) == 3 and r[0] in {label for label, _ in ROWS}}  # fmt: skip
    assert rows.keys() == {label for label, _ in ROWS}
    assert all(float(us) > 0 for us, _ in rows.values())
    for label in ("litmt seeded, nbest 64", "litmt seeded, nbest 8"):
        assert rows[label][1] == "yes (100/100 sentences)"
    assert rows["best segmentation"][1] == "(no sampling)"
