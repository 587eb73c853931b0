"""Generate docs/results.md, the one page of current results, from the result records
(docs/results/records/*.json, `litmt.records`):

    python -m reports.results_page            # rewrite docs/results.md
    python -m reports.results_page --check    # exit 1 if docs/results.md is out of date

The page is never edited by hand: tests/docs/test_numbers.py regenerates it and compares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from litmt.records import Record, read_records

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"

HEADER = """\
# Results

The current number of every recipe, engine and benchmark litmt publishes, each with the date,
the machine and the command that measured it. This page is generated from the result records
in `docs/results/records/` (`python -m reports.results_page`); the README and the guide quote
these numbers as links to their record, and a test fails when a quote differs from its record.
A run writes its record itself (`finalize.record=ID` at the end of training, a benchmark's
`--record ID`). How each number came about, and the runs before it, are in the
[lab notebook](notebook/index.md).

Speeds are comparable only within one record: each was measured in one run, alone on its
machine.
"""


def show(value: float) -> str:
    """A value as the page shows it: integers with thousands separators, floats as stored."""
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return format(value, ",")


def section(record: Record) -> str:
    """One record's section: its heading (the anchor quotes link to), facts and values."""
    lines = [f"## {record.id}", "", f"**{record.title}**", ""]
    lines += [f"- **Date:** {record.date}", f"- **Machine:** {record.machine}"]
    if record.source:
        lines.append(f"- **Run described in:** [{record.source}]({record.source})")
    if record.notes:
        lines.append(f"- **Notes:** {record.notes}")
    lines += ["", "```bash", record.command, "```", ""]
    lines += ["| value | | unit |", "|---|---:|---|"]
    lines += [
        f"| `{key}` | {show(value)} | {record.units.get(key, '')} |"
        for key, value in record.values.items()
    ]
    return "\n".join(lines) + "\n"


def render(records: dict[str, Record]) -> str:
    """The whole page: the header, an index table, one section per record (by id)."""
    index = ["| record | what | date |", "|---|---|---|"]
    index += [f"| [{r.id}](#{r.id}) | {r.title} | {r.date} |" for r in records.values()]
    parts = [HEADER, "\n".join(index) + "\n", *(section(r) for r in records.values())]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with --check compare it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render(read_records(ROOT))
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date: run python -m reports.results_page", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(PAGE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
