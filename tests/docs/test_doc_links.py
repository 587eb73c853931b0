"""References to docs pages from code, configs and scripts resolve (checks/doc_links.py), and
the check catches a missing page and a missing heading."""

from __future__ import annotations

from pathlib import Path

from checks.doc_links import broken

ROOT = Path(__file__).resolve().parents[2]


def test_every_reference_to_the_docs_resolves() -> None:
    problems = broken(ROOT)
    assert not problems, "\n".join(problems)


def test_a_missing_page_and_a_missing_heading_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## The end of a run\n\n```\n# no\n```\n"
    )
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "x.yaml").write_text(
        "a: 1  # docs/guide.md#the-end-of-a-run\nb: 2  # docs/guide.md#no\nc: 3  # docs/gone.md\n"
    )
    assert broken(tmp_path) == [
        "conf/x.yaml:2: docs/guide.md has no heading #no",
        "conf/x.yaml:3: docs/gone.md does not exist",
    ]
