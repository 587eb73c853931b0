"""The docs site builds with `mkdocs build --strict` (what CI runs), and the strict build
fails on a planted broken anchor and on a planted broken link."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def copy_of_the_docs(tmp_path: Path) -> Path:
    """mkdocs.yml, docs/, README.md, CHANGELOG.md and src/ (for the API pages) in tmp_path."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs")
    (root / "src").symlink_to(ROOT / "src")
    return root


def test_the_site_builds_strict_and_a_planted_broken_anchor_fails(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    ok = build(root, tmp_path / "site")
    assert ok.returncode == 0, ok.stderr[-4000:]
    assert (tmp_path / "site" / "guide" / "train" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").is_file()

    page = root / "docs" / "guide" / "serve.md"
    page.write_text(page.read_text() + "\nSee [the limits](train.md#no-such-heading).\n")
    bad = build(root, tmp_path / "site2")
    assert bad.returncode != 0
    assert "no-such-heading" in bad.stderr, bad.stderr[-3000:]


@pytest.mark.slow  # a third full build; the default suite keeps the planted-anchor one
def test_a_planted_broken_link_in_the_readme_fails(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\n[gone](docs/guide/no_such_page.md)\n")
    bad = build(root, tmp_path / "site")
    assert bad.returncode != 0
    assert "no_such_page.md" in bad.stderr, bad.stderr[-3000:]
