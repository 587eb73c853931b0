"""Every number the README and the user guide quote comes from one result record
(`litmt.records`): a quote is a Markdown link to the results page whose title names the
record and the value,

    [40.16](docs/results.md#multi30k_cpu "multi30k_cpu.test_bleu")

and this check fails when the quoted text is not the record's value (rounded to the decimals
the quote shows), when the link's anchor is not the record, or when the README or a guide page
states a measured number (a BLEU, a chrF, a speed, a speed ratio) without quoting a record.

    python -m checks.doc_numbers     # exit 1 and one line per problem

tests/docs/test_numbers.py runs it on the real files and shows it catching a changed number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from checks.problems import Problem, prose_lines, report
from litmt.records import Record, format_value, read_records, value_of

ROOT = Path(__file__).resolve().parents[1]

QUOTE = re.compile(
    r"\[(?P<text>[^\]]+)\]\((?P<href>[^)\s]*results\.md#(?P<anchor>[A-Za-z0-9_-]+))"
    r"\s+\"(?P<ref>[^\"]+)\"\)"
)
# a quote's link whose title is not on its line: a line break inside a quote hides it from QUOTE
BROKEN = re.compile(r"\]\([^)\s]*results\.md#[A-Za-z0-9_-]+\s*$")
BROKEN_WHY = (
    'a quote broken across lines is not checked: keep [N](results.md#ID "ID.key") on one line'
)
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.(?P<decimals>\d+))?")
# a measured number stated in prose: a number, then a metric or a speed unit
MEASURED = re.compile(
    r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?\s?"
    r"(?:BLEU\b|chrF\b|sentences/s\b|sent/s\b|tokens/s\b|words/s\b|×(?!\s*\d))"
)


def check_quote(text: str, anchor: str, ref: str, records: Mapping[str, Record]) -> str | None:
    """Why one quote is wrong, or None."""
    record_id = ref.partition(".")[0]
    if anchor != record_id:
        return f"quote {text!r} of {ref} links to #{anchor}, not to its record #{record_id}"
    try:
        value = value_of(records, ref)
    except KeyError as exc:
        return f"quote {text!r}: {exc.args[0]}"
    match = NUMBER.search(text)
    if not match:
        return f"quote {text!r} of {ref} holds no number"
    decimals = len(match["decimals"] or "")
    want = format_value(value, decimals)
    got = match[0].lstrip("+")
    if got.replace(",", "") != want.replace(",", ""):
        return f"quote {text!r} says {got}, but record {ref} is {value} ({want} at this precision)"
    return None


def quote_problems(line: str, records: Mapping[str, Record], where: str) -> list[Problem]:
    """The wrong quotes of one line, and a quote broken across lines (which QUOTE cannot see)."""
    problems = [
        Problem(where, why)
        for m in QUOTE.finditer(line)
        if (why := check_quote(m["text"], m["anchor"], m["ref"], records))
    ]
    if BROKEN.search(line):
        problems.append(Problem(where, BROKEN_WHY))
    return problems


def check_text(text: str, records: Mapping[str, Record], name: str) -> list[Problem]:
    """Every problem of one Markdown file: wrong quotes and unquoted measured numbers."""
    problems = []
    for number, line in prose_lines(text):
        problems += quote_problems(line, records, f"{name}:{number}")
        bare = QUOTE.sub("", line)
        bare = re.sub(r"`[^`]*`", "", bare)  # inline code: commands and settings, not results
        for m in MEASURED.finditer(bare):
            problems.append(
                Problem(
                    f"{name}:{number}",
                    f"{m[0]!r} is a measured number with no record: quote it as "
                    '[N](results.md#ID "ID.key") or move it to the lab notebook',
                )
            )
    return problems


def checked_files(root: Path = ROOT) -> list[Path]:
    """The pages a user reads first: README.md, docs/index.md and the user guide."""
    docs = root / "docs"
    return [root / "README.md", docs / "index.md", *sorted((docs / "guide").glob("*.md"))]


def check_all(root: Path = ROOT) -> list[Problem]:
    """Every problem in `checked_files`; quotes anywhere else in docs/ are checked too (the
    lab notebook and the generated results page are history and source, not quotes)."""
    records = read_records(root)
    files = checked_files(root)
    others = [
        p
        for p in sorted((root / "docs").rglob("*.md"))
        if p not in files and "notebook" not in p.parts and p.name != "results.md"
    ]
    problems = []
    for path in files:
        if path.is_file():
            name = str(path.relative_to(root))
            problems += check_text(path.read_text(encoding="utf-8"), records, name)
    for path in others:  # quotes only: these pages may describe runs in their own words
        name = str(path.relative_to(root))
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            problems += quote_problems(line, records, f"{name}:{number}")
    return problems


def main() -> int:
    """Print each problem; exit 1 if any."""
    return report(check_all())


if __name__ == "__main__":
    raise SystemExit(main())
