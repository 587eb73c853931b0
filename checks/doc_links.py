"""Every reference to the docs from outside them resolves: a ``docs/<page>.md`` or
``docs/<page>.md#anchor`` named in a comment, a docstring, a message or a config file under
conf/, src/, scripts/, benchmarks/, checks/, reports/ or tests/ must name a page that exists
and, with an anchor, a heading of that page (the site's slug rule, Python-Markdown's ``toc``).
Links inside docs/ and the README are the site build's to check (``mkdocs build --strict``).

    python -m checks.doc_links     # exit 1 and one line per broken reference
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from markdown.extensions.toc import slugify, unique

from checks.problems import prose_lines, report

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("conf", "src", "scripts", "benchmarks", "checks", "reports", "tests", ".ci")
SUFFIXES = {".py", ".yaml", ".yml", ".sh", ".toml", ".md", ""}
REFERENCE = re.compile(r"(?<![\w/.])docs/(?P<page>[\w./-]+?\.md)(?:#(?P<anchor>[\w-]+))?")
HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The heading anchors of a Markdown page, as the site builds them."""
    seen: set[str] = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        if m := HEADING.match(line):
            title = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", m["title"])
            seen.add(unique(slugify(title, "-"), seen))
    return frozenset(seen)


def broken(root: Path = ROOT) -> list[str]:
    """One line per reference that names a missing page or heading."""
    problems = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            skip = {"fixtures", "docs"} & set(
                path.relative_to(root).parts[1:]
            )  # tests/docs: planted
            if (
                not path.is_file()
                or path.suffix not in SUFFIXES
                or skip
                or any(part.endswith(".egg-info") for part in path.parts)
            ):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                for m in REFERENCE.finditer(line):
                    page = root / "docs" / m["page"]
                    where = f"{path.relative_to(root)}:{number}"
                    if not page.is_file():
                        problems.append(f"{where}: docs/{m['page']} does not exist")
                    elif m["anchor"] and m["anchor"] not in anchors(page):
                        problems.append(f"{where}: docs/{m['page']} has no heading #{m['anchor']}")
    return problems


def main() -> int:
    """Print each broken reference; exit 1 if any."""
    return report(broken(), "broken reference(s)")


if __name__ == "__main__":
    raise SystemExit(main())
