"""`benchmarks/benchmark_data.py` runs end to end on a tiny corpus and reports its numbers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import benchmark_data


def load_main() -> Callable[[list[str]], int]:
    return benchmark_data.main


def test_benchmark_script_on_tiny_corpus(
    text_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.md"
    argv = ["--dir", str(text_corpus), "--test-split", "test", "--vocab-size", "60"]
    assert load_main()([*argv, "--max-tokens", "200", "--out", str(out)]) == 0
    report = out.read_text()
    assert "second run (tokenizer and token ids from cache)" in report
    assert "| token budget + bucketing (default) |" in report
    assert report in capsys.readouterr().out


def test_benchmark_script_reports_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_main()(["--dir", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
