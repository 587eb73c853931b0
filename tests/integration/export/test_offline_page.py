"""The offline page (``format=web``) in headless Chromium, served by python's http.server:
type lines, choose the search, press Translate, and find python's translations, with no
request but to the static server.

Per line, the page must give the source ids of python sentencepiece (the page runs the C++
library compiled to wasm) and the output of python onnxruntime's search of the same beam on the
same export (engine=onnx), except at a near-tie: where the two outputs part, python onnxruntime
holds them within ``NEAR_TIE`` (1e-3, `checks.decode_margins`: the two tokens' log-probabilities,
or for beam search the two GNMT scores), a choice float rounding may flip between
onnxruntime-web's wasm kernels and the native ones. The page decodes in a Web Worker: it
answers key presses while it translates, it can be cancelled, and it runs on two wasm threads
when served with the cross-origin isolation headers (on one, saying why, without them). The
page-driving code is `benchmarks.browser_speed`'s, which runs the same checks on 50 test2016
lines of a real model.

Skips, saying why, without Debian's chromium, the playwright package, onnxruntime, or the
runtime files from npm (``npm ci --ignore-scripts`` in ``web/``). Set
``LITMT_OFFLINE_SCREENSHOT=PATH`` to save the page mid-translation there.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the onnx extra)")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright (Python package) is not installed"
)

from tiny_checkpoint import (  # noqa: E402
    build_tiny_multilingual_checkpoint,
    tiny_checkpoint_path,
)

from benchmarks.browser_speed import (  # noqa: E402
    NODE_MODULES,
    chromium_path,
    compare,
    python_reference,
    serve_folder,
    translate_in_page,
)
from litmt.decoding.search.rules import output_budgets  # noqa: E402
from litmt.deploy.engines.onnx import OnnxTranslator  # noqa: E402
from litmt.deploy.export.web import MODEL_DIR, export_web, missing_runtime  # noqa: E402

# Template sentences, one with words the tiny vocabulary lacks (unknown pieces, an umlaut, a
# capital, "!"), a blank line (no model run), a control character (removed, as in python) and
# "A", whose output the tiny model runs to the output budget (eos forced: max_len_a/b).
LINES = [
    "A red dog runs.",
    "A young bird sings outside.",
    "",
    "A small cat eats today.",
    "An old man walks here!",
    "A big boy sleeps with Müller\x07 in Zürich.",
    "A",
]


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip(
            "headless Chromium not found (install Debian's chromium: apt-get install chromium)"
        )
    if missing := missing_runtime(NODE_MODULES):
        pytest.skip(f"the page's npm runtime files are missing ({missing[0]}): npm ci in web/")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def check_page_against_python(
    browser, site, lines, target=None, screenshot=None, beam=1, threads=None, isolated=False
):
    """Run `lines` through the page at `site` (`beam`: the search chosen on the page, None: its
    default; `threads`: ?threads=N; `isolated`: served with the isolation headers) and python
    onnxruntime; assert what the module docstring says. Returns the page run and python's."""
    translator = OnnxTranslator(site / MODEL_DIR, threads=1)
    decoding = translator.meta["decoding"]
    k = decoding["beam_size"] if beam is None else beam
    ref = python_reference(translator, lines, target, k, decoding["length_penalty"])
    with serve_folder(site, isolated) as base:
        run = translate_in_page(browser, base, lines, target, screenshot, beam, threads)
        foreign = run.foreign(base)
    assert run.errors == [], run.errors
    assert run.src_ids == ref.src_ids  # the page's sentencepiece == python sentencepiece
    result = compare(translator, ref, run, decoding["length_penalty"] if k > 1 else None)
    assert result["real"] == 0, result["differences"]
    same = [i for i, (a, b) in enumerate(zip(ref.out_ids, run.out_ids, strict=True)) if a == b]
    assert [run.texts[i] for i in same] == [ref.texts[i] for i in same]  # detokenisation
    # loaded from the static server only, and nothing requested once the model was loaded
    assert foreign == [] and run.after_load == [], (foreign, run.after_load)
    assert any(u.endswith("model/decoder.onnx") for u in run.requests)
    assert any(u.endswith("vendor/ort-wasm-simd-threaded.wasm") for u in run.requests)
    print(
        f"offline page: {run.sentences_per_second:.1f} sentences/s on the tiny model "
        f"({len(same)}/{len(lines)} outputs identical, {result['near_tie']} near-ties)"
    )
    return run, ref


def test_page_translates_as_python_onnxruntime_with_no_other_request(
    browser, tmp_path_factory, tmp_path
):
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    site = export_web(ckpt, tmp_path / "site", NODE_MODULES)
    screenshot = os.environ.get("LITMT_OFFLINE_SCREENSHOT")
    run, ref = check_page_against_python(browser, site, LINES, screenshot=screenshot, beam=1)
    assert ref.texts[:2] == ["Ein roter Hund rennt.", "Ein junger Vogel singt draußen."]
    assert run.texts[2] == "" and run.src_ids[2] == []  # the blank line
    assert 1 in ref.src_ids[5]  # unknown pieces: the comparison covers <unk>
    config = json.loads((site / MODEL_DIR / "config.json").read_text())
    a, b = config["decoding"]["max_len_a"], config["decoding"]["max_len_b"]
    budget = output_budgets([len(ref.src_ids[6])], a, b, config["model"]["max_positions"])
    assert len(ref.out_ids[6]) == int(budget[0])  # "A" runs to the budget: eos forced there


def test_a_multilingual_export_routes_the_chosen_target(browser, tmp_path_factory, tmp_path):
    """en→de and en→fr with the language token forced as the first target token: the page
    offers both targets, and French comes out when French is chosen."""
    directory = tmp_path_factory.mktemp("offline_multi")
    ckpt = build_tiny_multilingual_checkpoint(directory, "target")
    site = export_web(ckpt, tmp_path / "site", NODE_MODULES)
    run, _ = check_page_against_python(browser, site, LINES[:2], target="fr", beam=1)
    de = python_reference(OnnxTranslator(site / MODEL_DIR, threads=1), LINES[:2], "de")
    assert run.texts != de.texts  # the target choice reached the model
    assert run.out_ids[0][0] != de.out_ids[0][0]  # <2fr> forced, not <2de>


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The tiny model's folder, exported with beam 4 as its decoding setting."""
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    out = tmp_path_factory.mktemp("offline_site") / "site"
    return export_web(ckpt, out, NODE_MODULES, decoding={"beam_size": 4})


def test_the_page_searches_with_the_exports_beam_as_python_does(browser, site):
    """The page's default search is the export's (beam 4 here): its outputs are python
    onnxruntime's beam 4, and they are not all its greedy ones (the beam mattered)."""
    _, ref = check_page_against_python(browser, site, LINES, beam=None)
    greedy = python_reference(OnnxTranslator(site / MODEL_DIR, threads=1), LINES, beam=1)
    assert ref.out_ids != greedy.out_ids


def test_two_threads_when_isolated_one_saying_why_otherwise(browser, site):
    run, _ = check_page_against_python(browser, site, LINES, beam=4, threads=2, isolated=True)
    assert run.threads == 2 and "2 threads" in run.load_status
    run, _ = check_page_against_python(browser, site, LINES[:2], beam=4, threads=2)
    assert run.threads == 1
    assert (
        "1 thread: this server does not send the cross-origin isolation headers" in run.load_status
    )


def test_the_page_answers_key_presses_while_it_translates_and_can_cancel(browser, site):
    """Hundreds of lines at beam 4: key presses reach the page within 100 ms while the worker
    translates; Cancel stops it between two steps, with the lines done so far kept."""
    lines = [line for line in LINES if line.strip()] * 60
    with serve_folder(site) as base:
        run = translate_in_page(browser, base, lines[:120], beam=4, press_keys=True)
        page = browser.new_page()
        page.goto(base)
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)
        page.fill("#source", "\n".join(lines))
        page.click("#translate")
        page.wait_for_function("document.querySelectorAll('#output li').length >= 3")
        page.click("#cancel")
        page.wait_for_selector("body[data-state=cancelled]", timeout=30_000)
        done = page.eval_on_selector_all("#output li", "ls => ls.length")
        summary = page.inner_text("#summary")
        page.close()
    assert run.errors == [] and len(run.out_ids) == 120
    assert len(run.input_lags_ms) >= 3, "no key press landed while the page translated"
    assert max(run.input_lags_ms) < 100, run.input_lags_ms
    assert 3 <= done < len(lines) and summary == f"cancelled after {done} of {len(lines)} lines"


@pytest.mark.slow
def test_fifty_test2016_lines(browser, tmp_path_factory, tmp_path):
    """The issue's 50 test2016 lines (real sentences for the tokenizer; the tiny model's
    outputs run to the budget), as `benchmarks.browser_speed` checks a real model."""
    from benchmarks.common import multi30k_lines
    from litmt.errors import LitmtError

    try:
        lines = multi30k_lines("test2016", "en", 50)
    except LitmtError as exc:
        pytest.skip(str(exc))
    site = export_web(tiny_checkpoint_path(tmp_path_factory), tmp_path / "site", NODE_MODULES)
    check_page_against_python(browser, site, lines, beam=1)
    check_page_against_python(browser, site, lines, beam=None)
