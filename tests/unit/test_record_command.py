"""A result record's command is the command as typed, without the options that only name this
machine's output files (`benchmarks.common.published_argv`)."""

from __future__ import annotations

from benchmarks.common import published_argv


def test_local_output_options_and_their_values_are_left_out() -> None:
    argv = ["--model", "a=runs/a.ckpt", "--json", "/scratch/t.json", "--out=/scratch/site",
            "--work", "/scratch/w", "--threads", "2", "--record", "students"]  # fmt: skip
    assert published_argv(argv) == [
        "--model", "a=runs/a.ckpt", "--threads", "2", "--record", "students"
    ]  # fmt: skip
    assert published_argv(["--exports", "exports/x", "--jsonl", "k"]) == [
        "--exports", "exports/x", "--jsonl", "k"
    ]  # fmt: skip
