"""MkDocs hook (mkdocs.yml ``hooks``): the site's home page is the repository's README.md, so
the first hour is written once. Its links into ``docs/`` are rewritten to be relative to the
site; links elsewhere in the repository are not allowed in the README (the strict build fails
on them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

README = Path(__file__).resolve().parents[1] / "README.md"
_DOCS_LINK = re.compile(r"\]\(docs/")
_CHANGELOG_LINK = re.compile(r"\]\(CHANGELOG\.md")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """index.md → README.md with ``](docs/x)`` links as ``](x)``."""
    if page.file.src_uri != "index.md":
        return markdown
    text = _DOCS_LINK.sub("](", README.read_text(encoding="utf-8"))
    return _CHANGELOG_LINK.sub("](changelog.md", text)
