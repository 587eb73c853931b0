"""Write the result record of a finished training run from its ``scores.json`` (what
``finalize.record=ID`` does at the end of a run, for a run that finished without it):

    python -m reports.record_run logs/multi30k_cpu/runs/RUN --id multi30k_cpu

Run it on the machine that trained the run (the record names this machine), from the
repository root; then regenerate the results page: ``python -m reports.results_page``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from litmt.records import write_record
from litmt.training.finalize import SCORES_FILE
from litmt.training.finalize_report import run_record


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, write the record, print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a training run directory with scores.json")
    parser.add_argument("--id", required=True, help="the record id (snake_case)")
    parser.add_argument("--title", default=None, help="one line: what was measured")
    parser.add_argument("--source", default="", help="the docs page describing the run")
    args = parser.parse_args(argv)
    scores = args.run_dir / SCORES_FILE
    if not scores.is_file():
        parser.error(f"{scores} not found: the run has not finished its end step (finalize)")
    record = run_record(args.run_dir, json.loads(scores.read_text()), args.id, args.title)
    record.source = args.source
    print(write_record(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
