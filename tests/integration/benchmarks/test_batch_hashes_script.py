"""`checks/batch_hashes.py` runs end to end (one case, no DDP) and prints its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks import batch_hashes


def test_batch_hashes_prints_every_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hashes.json"
    argv = ["--cases", "one-pair", "--ddp-cases", "", "--work", str(tmp_path / "w")]
    assert batch_hashes.main([*argv, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    parts = ["train e0", "train e1", "valid", "test", "resume e1@3", "meta"]
    for part in parts:
        assert f"| one-pair | {part} |" in table
    assert "!= tail" not in table  # the resumed epoch is the tail of the full one
    rows = {line.split(" | ")[1]: line.split(" | ")[3] for line in table.splitlines()[2:]}
    assert rows["train e0"] != rows["train e1"]  # each epoch has its own order
    assert out.is_file() and not (tmp_path / "w").exists()  # the scratch folder is removed
