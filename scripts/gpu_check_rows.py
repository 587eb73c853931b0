"""The rows of `scripts/gpu_check.py`: planned first, each measured in its own guard, each
appended as soon as it is measured. Imports no Hydra, omegaconf, `datasets` or wandb.

Files in OUT:
- gpu_check_plan.jsonl: every row the run will write ({"check", "setting"}), written before
  the first is measured; `gpu_check.sh` adds a FAIL row for each one missing from the rows
  (a crash, a kill), so the table is never silently short;
- gpu_check_rows.jsonl: the rows ({"check", "setting", "result", "status", "peak_mem"});
- gpu_check_current.txt: the row being measured (removed when it is written).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

Measure = Callable[[], tuple[str, str]]  # one row's measurement: (result, status)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """`exc` as "Type: first line of its message", at most `limit` characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InjectedFailure(RuntimeError):
    """Raised inside a row's guard by ``--inject-failure`` (dry run only)."""


class Rows:
    """The plan and the rows of one run, in OUT; the peak CUDA memory of each row's step.

    Args:
        out: the folder of the plan, rows and current-row files.
        inject: dry run only: the row whose "check | setting" starts with this raises
            `InjectedFailure` inside its guard, or None.
        crash: dry run only: at the row whose "check | setting" starts with this, the
            process exits at once with status 70 (as a crash or a kill would: no row, no
            traceback), or None.
    """

    def __init__(self, out: Path, inject: str | None = None, crash: str | None = None) -> None:
        self.path, self.current = out / "gpu_check_rows.jsonl", out / "gpu_check_current.txt"
        self.plan_path = out / "gpu_check_plan.jsonl"
        self.inject, self.crash = inject, crash
        self.failed = 0

    def plan(self, labels: Sequence[tuple[str, str]]) -> None:
        """Write the (check, setting) of every row this run will write, in order."""
        text = "".join(json.dumps({"check": c, "setting": s}) + "\n" for c, s in labels)
        self.plan_path.write_text(text, encoding="utf-8")

    def start(self, check: str, setting: str) -> None:
        self.current.write_text(f"{check} | {setting}\n", encoding="utf-8")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def add(self, check: str, setting: str, result: str, status: str) -> None:
        mem = "-"
        if torch.cuda.is_available():
            mem = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        row = {"check": check, "setting": setting, "result": result, "status": status,
               "peak_mem": mem}  # fmt: skip
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.current.unlink(missing_ok=True)
        self.failed += status == "FAIL"
        print(f"[gpu_check] {check} | {setting} | {result} | {status} | {mem}", flush=True)

    def measure(self, check: str, setting: str, measure: Measure) -> str:
        """Measure one row and append it; returns its status.

        An exception inside `measure` makes this row a FAIL carrying the error's type and
        message (the traceback goes to stderr, i.e. gpu_check_runs.log), and the run goes
        on with the next row.
        """
        self.start(check, setting)
        label = f"{check} | {setting}"
        if self.crash is not None and label.startswith(self.crash):
            print(f"[gpu_check] --inject-crash {self.crash!r}: exiting at {label}", flush=True)
            os._exit(70)
        try:
            if self.inject is not None and label.startswith(self.inject):
                raise InjectedFailure(f"injected by --inject-failure {self.inject!r}")
            result, status = measure()
        except Exception as exc:  # the per-row guard: the error is this row's FAIL result
            traceback.print_exc()
            result, status = f"error: {one_line(exc)}", "FAIL"
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an out-of-memory, the next row starts clean
        self.add(check, setting, result, status)
        return status

    def run(self, planned: Sequence[tuple[str, str, Measure]]) -> None:
        """Write the plan of `planned` rows, then measure each in its own guard, in order."""
        self.plan([(check, setting) for check, setting, _ in planned])
        for check, setting, measure in planned:
            self.measure(check, setting, measure)
