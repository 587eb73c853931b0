"""The offline page in headless Chromium: its speed and its agreement with python onnxruntime.

    python -m benchmarks.browser_speed --ckpt model.ckpt [--lines 50] [--quantization int8]
        [--screenshot docs/offline_page.png] [--out DIR]

Builds the hostable folder of --ckpt (`litmt.deploy.export.web.export_web`: the page, the ONNX
export, the runtime from ``web/node_modules``; ``npm ci --ignore-scripts`` in ``web/`` first),
serves it from a local static server (python's http.server, as a user would), opens it in
Debian's chromium through Playwright, puts the first --lines lines of --src in the textarea and
presses Translate: the page translates them one by one (greedy, batch 1, onnxruntime-web's
single-threaded wasm backend). Then it compares, line by line, with python onnxruntime's
greedy search on the same export (engine=onnx, `OnnxTranslator`, one sentence per batch):

- the source ids the page's sentencepiece (wasm) gave against python sentencepiece's: equal;
- the output ids: equal, or a ``near-tie``: at the first token where they part, python
  onnxruntime's log-probabilities of the two tokens (eos for an ended output) differ by at
  most `NEAR_TIE` (`checks.decode_margins`), a choice float rounding may flip (wasm SIMD
  kernels against the native ones); anything else is ``real`` and the script exits 1;
- requests: every request went to the static server, and none at all once the model was
  loaded (the page's promise: nothing typed leaves the machine).

Prints the page's sentences/s (its own clock, from the click to the last line), the counts
above, and the load size. The browser test (tests/integration/export/test_offline_page.py) runs the
same functions on the tiny model.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.nn.functional as F

from benchmarks.common import MULTI30K, REPO
from checks.decode_margins import NEAR_TIE
from litmt.data.text import read_text_file
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID
from litmt.errors import LitmtError

NODE_MODULES = REPO / "web" / "node_modules"  # `npm ci --ignore-scripts` in web/ fills it
LOAD_TIMEOUT_MS = 300_000  # a real model over a slow disk
LINE_TIMEOUT_MS = 60_000  # per line translated


def chromium_path() -> str | None:
    """Debian's chromium binary, or None."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    return None


@contextmanager
def serve_folder(directory: Path) -> Iterator[str]:
    """Serve `directory` with python's http.server on 127.0.0.1 (a free port) in a thread;
    yields its base URL (``http://127.0.0.1:PORT/``)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # no line per request on stderr
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class PageRun:
    """What the page did with `lines`: per line its source ids, output ids (the forced tag of
    a target-placement model first) and text; its sentences/s; the requests it made."""

    src_ids: list[list[int]]
    out_ids: list[list[int]]
    texts: list[str]
    sentences_per_second: float
    load_status: str
    requests: list[str] = field(default_factory=list)  # every URL, in order
    after_load: list[str] = field(default_factory=list)  # URLs requested once loaded
    errors: list[str] = field(default_factory=list)  # uncaught JavaScript errors

    def foreign(self, base: str) -> list[str]:
        """Requests that went anywhere but the server at `base` (data: URLs are no request)."""
        origin = urlsplit(base)[:2]
        return [u for u in self.requests if not u.startswith("data:") and urlsplit(u)[:2] != origin]


def _ids(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").split()]


def translate_in_page(
    browser: Any,
    base: str,
    lines: Sequence[str],
    target: str | None = None,
    screenshot: str | Path | None = None,
) -> PageRun:
    """Open the page at `base` in `browser` (a Playwright browser), wait for the model, put
    `lines` in the textarea, choose `target` (a multilingual export; None: the first), press
    Translate and read the output back. `screenshot`: save the page once half of the lines
    are out (mid-translation on a real model)."""
    page = browser.new_page(viewport={"width": 900, "height": 720})
    run = PageRun([], [], [], 0.0, "")
    loaded = threading.Event()
    page.on("pageerror", lambda exc: run.errors.append(str(exc)))

    def on_request(request: Any) -> None:
        run.requests.append(request.url)
        if loaded.is_set():
            run.after_load.append(request.url)

    page.on("request", on_request)
    page.goto(base)
    page.wait_for_selector(
        "body[data-state=ready], body[data-state=error]", timeout=LOAD_TIMEOUT_MS
    )
    loaded.set()
    run.load_status = page.inner_text("#load-status")
    if page.get_attribute("body", "data-state") == "error":
        raise LitmtError(f"the page failed to load the model: {run.load_status}")
    page.fill("#source", "\n".join(lines))
    if target is not None:
        page.select_option("#target", target)
    page.click("#translate")
    if screenshot:
        half = f"document.querySelectorAll('#output li').length >= {max(1, len(lines) // 2)}"
        page.wait_for_function(half, timeout=LINE_TIMEOUT_MS * len(lines))
        page.screenshot(path=str(screenshot), full_page=True)
    done = "body[data-state=done], body[data-state=error]"
    page.wait_for_selector(done, timeout=LINE_TIMEOUT_MS * len(lines))
    items = page.eval_on_selector_all(
        "#output li",
        "ls => ls.map(l => [l.dataset.srcIds, l.dataset.outIds, l.querySelector('.text').textContent])",
    )
    run.src_ids = [_ids(s) for s, _, _ in items]
    run.out_ids = [_ids(o) for _, o, _ in items]
    run.texts = [t for _, _, t in items]
    rate = page.get_attribute("#summary", "data-sentences-per-second")
    run.sentences_per_second = float(rate or 0.0)
    page.close()
    return run


@dataclass
class Reference:
    """Python onnxruntime's view of the same lines: source ids, greedy output ids, texts."""

    src_ids: list[list[int]]
    out_ids: list[list[int]]
    texts: list[str]


def python_reference(translator: Any, lines: Sequence[str], target: str | None = None) -> Reference:
    """Greedy search of `translator` (an `OnnxTranslator`) on `lines`, one sentence per batch
    as the page decodes, with the ids prepared as `Translator.translate` prepares them."""
    route = translator.route(None, target)
    src = [route.source_ids(translator.prepare(x), translator.max_source_tokens) for x in lines]
    prefixes = [route.prefix_ids([]) or [] for _ in lines]
    hyps = translator.search_ids(src, beam_size=1, max_tokens=1, prefixes=prefixes)
    out = [h[0].tokens for h in hyps]
    return Reference(src, out, translator.tokenizer.decode_tgt(out))


def step_log_probs(translator: Any, src: Sequence[int], prefix: Sequence[int]) -> torch.Tensor:
    """(V,) log-probabilities of the token after bos + `prefix`, python onnxruntime."""
    model = translator.step_model
    state, _ = model.encode(torch.tensor([list(src)]))  # (1, S)
    logits = None
    for token in [BOS_ID, *prefix]:
        logits = model.decode_step(torch.tensor([token]), state)  # (1, V)
    return F.log_softmax(logits[0].float(), dim=-1)


def compare(translator: Any, ref: Reference, run: PageRun) -> dict[str, Any]:
    """Line-by-line agreement of the page with python: ``ids_equal`` (source ids), then
    ``same``, ``near_tie`` and ``real`` output lines (see the module docstring), with the
    details of each difference in ``differences``; ``texts_equal``: lines whose text is
    python's (the detokenisation: every ``same`` line should count)."""
    if len(run.out_ids) != len(ref.out_ids):
        raise LitmtError(f"the page gave {len(run.out_ids)} lines for {len(ref.out_ids)}")
    counts: dict[str, Any] = {"ids_equal": 0, "texts_equal": 0, "same": 0, "near_tie": 0, "real": 0}
    differences = []
    for i, (src, a, b) in enumerate(zip(ref.src_ids, ref.out_ids, run.out_ids, strict=True)):
        counts["ids_equal"] += src == run.src_ids[i]
        counts["texts_equal"] += ref.texts[i] == run.texts[i]
        x, y = [*a, EOS_ID], [*b, EOS_ID]
        if x == y:
            counts["same"] += 1
            continue
        t = next(j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)
        logp = step_log_probs(translator, src, x[:t])
        gap = abs(float(logp[x[t]] - logp[y[t]]))
        kind = "near_tie" if gap <= NEAR_TIE else "real"
        counts[kind] += 1
        differences.append({"line": i, "kind": kind, "step": t, "gap": gap, "python": a, "page": b})
    counts["differences"] = differences
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--ckpt", required=True, help="the litmt checkpoint")
    p.add_argument("--src", default=str(MULTI30K / "test2016.en"), help="source test file")
    p.add_argument("--lines", type=int, default=50, help="the first N lines of --src")
    p.add_argument("--target", default=None, help="target language (multilingual models)")
    p.add_argument("--quantization", default="none", choices=("none", "int8"), help="weights")
    p.add_argument("--node-modules", default=str(NODE_MODULES), help="npm's runtime files")
    p.add_argument("--out", default=None, help="keep the hostable folder here (else temporary)")
    p.add_argument("--screenshot", default=None, help="save the page mid-translation (PNG)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    from litmt.cli.script.exits import cli_errors
    from litmt.deploy.engines.onnx import OnnxTranslator
    from litmt.deploy.export.web import MODEL_DIR, export_web

    args = parse_args(argv)
    with cli_errors(), tempfile.TemporaryDirectory() as tmp:
        lines = read_text_file(args.src, "--src")[: args.lines]
        chromium = chromium_path()
        if chromium is None:
            raise LitmtError("chromium not found (Debian: apt-get install chromium)")
        site = Path(args.out or Path(tmp) / "site")
        export_web(args.ckpt, site, args.node_modules, quantization=args.quantization, force=True)
        translator = OnnxTranslator(site / MODEL_DIR, threads=1)
        ref = python_reference(translator, lines, args.target)
        with serve_folder(site) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            run = translate_in_page(browser, base, lines, args.target, args.screenshot)
            browser.close()
        result = compare(translator, ref, run)
        foreign = run.foreign(base)
    n = len(lines)
    print(f"lines: {n}  quantization: {args.quantization}  ({run.load_status})")
    print(f"page: {run.sentences_per_second:.2f} sentences/s (greedy, batch 1, wasm, 1 thread)")
    print(f"source ids equal to python sentencepiece: {result['ids_equal']}/{n}")
    print(f"texts equal to python's: {result['texts_equal']}/{n}")
    print(
        f"outputs: {result['same']}/{n} identical to python onnxruntime, "
        f"{result['near_tie']} near-ties (NEAR_TIE={NEAR_TIE}), {result['real']} real differences"
    )
    for d in result["differences"]:
        print(f"  line {d['line']} ({d['kind']}, step {d['step']}, gap {d['gap']:.2e})")
    print(f"requests after load: {len(run.after_load)}; to other origins: {len(foreign)}")
    ok = result["ids_equal"] == n and result["real"] == 0 and not foreign and not run.after_load
    return 0 if ok and not run.errors else 1


if __name__ == "__main__":
    sys.exit(main())
