"""The attention explorer in headless Chromium: type a sentence, wait, find the translation
and a rendered heatmap in the DOM, switch heads; with a multilingual model, choose the
direction.

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

from server_thread import ServerThread  # noqa: E402
from tiny_checkpoint import (  # noqa: E402
    build_tiny_multilingual_checkpoint,
    tiny_checkpoint_path,
)

from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.server.app import ServeConfig, build_server_app  # noqa: E402

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


def open_page(browser, url: str) -> tuple[object, list[str]]:
    """The explorer at `url` in a new page, and the list its JavaScript errors go to."""
    page = browser.new_page(viewport={"width": 900, "height": 760})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url + "/")
    return page, errors


def test_type_a_sentence_and_see_translation_and_heatmap(browser, tmp_path_factory, tmp_path):
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    expected = Translator.from_checkpoint(ckpt, device="cpu").translate([SENTENCE], beam_size=1)[0]
    app = build_server_app(ckpt, device="cpu", settings=ServeConfig(decoding={"beam_size": 1}))
    with ServerThread(app) as server:
        page, errors = open_page(browser, server.url)
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


def test_a_multilingual_model_gets_a_direction_choice(browser, tmp_path_factory):
    """en→de and en→fr in one model: the page lists both, starts on the first, and the
    chosen direction's translation and language token come back (as /translate gives)."""
    ckpt = build_tiny_multilingual_checkpoint(tmp_path_factory.mktemp("page_multi"), "target")
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    want = {t: translator.translate([SENTENCE], tgt_lang=t, beam_size=1)[0] for t in ("de", "fr")}
    assert want["de"] != want["fr"]
    app = build_server_app(ckpt, device="cpu", settings=ServeConfig(decoding={"beam_size": 1}))
    with ServerThread(app) as server:
        page, errors = open_page(browser, server.url)
        page.wait_for_selector("#direction:not([hidden])", timeout=30_000)
        options = page.eval_on_selector_all(
            "#direction option", "os => os.map(o => [o.value, o.textContent])"
        )
        assert options == [["en|de", "English \u2192 German"], ["en|fr", "English \u2192 French"]]
        assert page.locator("#pair").inner_text() == "English \u2192 German"
        page.locator("#source").fill(SENTENCE)
        page.locator("#source").press("Enter")
        page.wait_for_function(
            "want => document.getElementById('translation').textContent === want", arg=want["de"]
        )
        assert page.locator("#heatmap tbody th").first.inner_text() == "<2de>"
        page.select_option("#direction", "en|fr")  # re-translates in the new direction
        page.wait_for_function(
            "want => document.getElementById('translation').textContent === want", arg=want["fr"]
        )
        assert page.locator("#heatmap tbody th").first.inner_text() == "<2fr>"
        assert page.locator("#pair").inner_text() == "English \u2192 French"
        assert errors == []
