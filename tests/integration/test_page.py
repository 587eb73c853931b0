"""The attention explorer in headless Chromium: type a sentence, wait, find the translation
and a rendered heatmap in the DOM, switch heads.

Uses Debian's ``chromium`` (``.ci/run`` installs it) through Playwright's Python package
with ``executable_path`` (no browser download). Set ``LITMT_PAGE_SCREENSHOT=PATH`` to also
save the screenshot there (docs/attention_explorer.png was made so).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright (Python package) is not installed"
)

from tiny_checkpoint import tiny_checkpoint_path  # noqa: E402

from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.server import ServerThread, ServeSettings, build_server_app  # noqa: E402

SENTENCE = "A young bird sings outside."


def chromium_path() -> str | None:
    """Debian's chromium binary, or None."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip(
            "headless Chromium not found (install Debian's chromium: apt-get install chromium)"
        )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def test_type_a_sentence_and_see_translation_and_heatmap(browser, tmp_path_factory, tmp_path):
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    expected = Translator.from_checkpoint(ckpt, device="cpu").translate([SENTENCE], beam_size=1)[0]
    app = build_server_app(ckpt, device="cpu", settings=ServeSettings(decoding={"beam_size": 1}))
    with ServerThread(app) as server:
        page = browser.new_page(viewport={"width": 900, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.locator("#source").press_sequentially(SENTENCE, delay=5)  # typed; no Enter
        page.wait_for_selector("#heatmap td.cell", timeout=30_000)
        assert page.locator("#translation").inner_text() == expected
        n_src = page.locator("#heatmap thead th").count() - 1
        n_tgt = page.locator("#heatmap tbody tr").count()
        assert n_src >= 4 and n_tgt >= 4
        assert page.locator("#heatmap td.cell").count() == n_src * n_tgt
        assert page.locator("#heatmap tbody th").last.inner_text() == "</s>"
        # rendered: cells are coloured by weight, and every row (a softmax) sums to 1
        weights = page.eval_on_selector_all(
            "#heatmap tbody tr",
            "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.weight)))",
        )
        assert all(abs(sum(row) - 1) < 0.01 for row in weights)
        colours = set(
            page.eval_on_selector_all(
                "#heatmap td.cell", "cells => cells.map(c => c.style.backgroundColor)"
            )
        )
        assert len(colours) > 3
        mean = weights
        page.select_option("#head", "0")  # one head instead of the mean
        head0 = page.eval_on_selector_all(
            "#heatmap tbody tr",
            "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.weight)))",
        )
        assert head0 != mean
        page.select_option("#head", "mean")
        page.screenshot(path=str(tmp_path / "attention_explorer.png"), full_page=True)
        if os.environ.get("LITMT_PAGE_SCREENSHOT"):
            page.screenshot(path=os.environ["LITMT_PAGE_SCREENSHOT"], full_page=True)
        assert errors == []
        assert Path(tmp_path / "attention_explorer.png").stat().st_size > 10_000
