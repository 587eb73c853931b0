"""Every number the README and the guide quote is its record's (checks/doc_numbers.py), the
results page is generated from the records, and the check catches a number changed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checks.doc_numbers import check_all, check_text
from litmt.errors import ConfigError
from litmt.records import Record, read_record, read_records, write_record
from reports.results_page import PAGE, render

ROOT = Path(__file__).resolve().parents[2]


def records() -> dict[str, Record]:
    return {
        "multi30k_cpu": Record(
            id="multi30k_cpu",
            title="t",
            date="2026-12-05",
            machine="m",
            command="c",
            values={"test_bleu": 40.16, "sent_per_s": 1839.0, "speedup": 6.4},
        )
    }


def test_the_real_readme_and_docs_quote_their_records() -> None:
    problems = check_all(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_the_results_page_is_generated_from_the_records() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(read_records(ROOT)), (
        "docs/results.md is stale: python -m reports.results_page"
    )


def test_a_number_changed_by_hand_in_the_readme_fails() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    real = read_records(ROOT)
    import re

    from checks.doc_numbers import QUOTE

    quote = QUOTE.search(readme)
    assert quote, "the README quotes no record"
    number = re.search(r"\d+(?:\.\d+)?", quote["text"])[0]
    changed = str(round(float(number) + 0.37, 2)) if "." in number else str(int(number) + 3)
    edited = readme.replace(quote[0], quote[0].replace(number, changed, 1), 1)
    problems = check_text(edited, real, "README.md")
    assert len(problems) == 1 and f"says {changed}" in problems[0].message, problems
    assert not check_text(readme, real, "README.md")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('[40.16](results.md#multi30k_cpu "multi30k_cpu.test_bleu")', None),
        ('[40.2](results.md#multi30k_cpu "multi30k_cpu.test_bleu")', None),  # rounded
        ('[1,839](results.md#multi30k_cpu "multi30k_cpu.sent_per_s")', None),
        ('[6.4×](results.md#multi30k_cpu "multi30k_cpu.speedup")', None),
        ('[40.61](results.md#multi30k_cpu "multi30k_cpu.test_bleu")', "says 40.61"),
        ('[40.16](results.md#other "multi30k_cpu.test_bleu")', "not to its record"),
        ('[40.16](results.md#multi30k_cpu "multi30k_cpu.nope")', "has no value 'nope'"),
        ('[40.16](results.md#gone "gone.test_bleu")', "no record 'gone'"),
        ("the recipe gives 40.16 BLEU on test2016", "no record"),
        ("int8 decodes 550 sentences/s", "no record"),
        ("ct2 is 4.6× the torch engine", "no record"),
        ("`beam_size=5` on 4 layers, 2 threads and BLEU on valid", None),
        ("```\n550 sentences/s in a code block\n```", None),
        ('[40.61](results.md#multi30k_cpu\n"multi30k_cpu.test_bleu")', "broken across lines"),
    ],
)
def test_quotes_and_unquoted_numbers(line: str, why: str | None) -> None:
    problems = check_text(line, records(), "x.md")
    if why is None:
        assert not problems, problems
    else:
        assert len(problems) == 1 and why in problems[0].message, problems


def test_a_record_refuses_what_is_not_a_number(tmp_path: Path) -> None:
    good = records()["multi30k_cpu"]
    path = write_record(good, tmp_path)
    assert read_record(path) == good
    data = json.loads(path.read_text())
    data["values"]["test_bleu"] = "40.16"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"test_bleu is '40\.16', not a number"):
        read_record(path)
    data["values"]["test_bleu"] = 40.16
    data["extra"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown keys \\['extra'\\]"):
        read_record(path)
