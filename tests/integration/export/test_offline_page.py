"""The offline page (``format=web``) in headless Chromium, served by python's http.server:
type lines, press Translate, and find python's translations, with no request but to the
static server.

Per line, the page must give the source ids of python sentencepiece (the page runs the C++
library compiled to wasm) and the output of python onnxruntime's greedy search on the same
export (engine=onnx), except at a near-tie: where the two outputs part, python onnxruntime's
log-probabilities of the two tokens differ by at most ``NEAR_TIE`` (1e-3,
`checks.decode_margins`), a choice float rounding may flip between onnxruntime-web's wasm
kernels and the native ones. The page-driving code is `benchmarks.browser_speed`'s, which runs
the same check on 50 test2016 lines of a real model.

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


def check_page_against_python(browser, site, lines, target=None, screenshot=None):
    """Run `lines` through the page at `site` and python onnxruntime; assert what the module
    docstring says. Returns the page run."""
    translator = OnnxTranslator(site / MODEL_DIR, threads=1)
    ref = python_reference(translator, lines, target)
    with serve_folder(site) as base:
        run = translate_in_page(browser, base, lines, target, screenshot)
        foreign = run.foreign(base)
    assert run.errors == [], run.errors
    assert run.src_ids == ref.src_ids  # the page's sentencepiece == python sentencepiece
    result = compare(translator, ref, run)
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
    run, ref = check_page_against_python(browser, site, LINES, screenshot=screenshot)
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
    run, _ = check_page_against_python(browser, site, LINES[:2], target="fr")
    de = python_reference(OnnxTranslator(site / MODEL_DIR, threads=1), LINES[:2], "de")
    assert run.texts != de.texts  # the target choice reached the model
    assert run.out_ids[0][0] != de.out_ids[0][0]  # <2fr> forced, not <2de>


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
    check_page_against_python(browser, site, lines)
