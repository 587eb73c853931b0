"""`scripts/benchmark_data.py` runs end to end on a tiny corpus and reports its numbers."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_data.py"


def load_main() -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location("benchmark_data", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


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
