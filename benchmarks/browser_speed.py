"""The offline page in headless Chromium: its speed, its answers to the user while it works,
and its agreement with python onnxruntime and the torch engine.

    python -m benchmarks.browser_speed --ckpt model.ckpt [--lines 50] [--quantization int8]
        [--beam 1 5] [--threads 1 2] [--screenshot docs/offline_page.png] [--out DIR]
        [--record ID]

Builds the hostable folder of --ckpt (`litmt.deploy.export.web.export_web`: the page, the ONNX
export, the runtime from ``web/node_modules``; ``npm ci --ignore-scripts`` in ``web/`` first),
serves it from a local static server (python's http.server with the folder's cross-origin
isolation headers, as its ``serve.py`` does), opens it in Debian's chromium through Playwright,
and for each --beam and --threads (``?threads=N``) puts the first --lines lines of --src in the
textarea, chooses the search and presses Translate: the page's Web Worker translates them one by
one (batch 1). While it works, a key is pressed in the textarea every `KEY_EVERY_S`: the page
records how long each took to reach its handler (``window.inputLagsMs``). Then, line by line,
against python onnxruntime's search of the same beam on the same export (engine=onnx,
`OnnxTranslator`, one sentence per batch):

- the source ids the page's sentencepiece (wasm) gave against python sentencepiece's: equal;
- the output ids: equal, or a ``near-tie``: where they part, python onnxruntime holds the two
  outputs within `NEAR_TIE` (`checks.decode_margins`): the log-probabilities of their two tokens
  at the first position where they differ, or (beam search) their two GNMT scores, a choice
  float rounding may flip (wasm SIMD kernels against the native ones); anything else is
  ``real`` and the script exits 1;
- requests: every request went to the static server, and none at all once the model was
  loaded (the page's promise: nothing typed leaves the machine).

With beam search the page's outputs are also compared with the torch engine's (the checkpoint,
`Translator`), near-ties measured by the parity rule (`checks.decode_margins.compare_outputs`).

Prints a table: search, threads, sentences/s (the page's own clock, from the click to the last
line), the slowest key press, the counts above; and the load size. The browser test
(tests/integration/export/test_offline_page.py) runs the same functions on the tiny model.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from benchmarks.common import MULTI30K, REPO, write_result_record
from checks.decode_margins import NEAR_TIE, compare_outputs, parting_gaps
from litmt.data.text import read_text_file
from litmt.data.tokenization.tokenizer import EOS_ID
from litmt.deploy.export.web import ISOLATION_HEADERS
from litmt.errors import LitmtError

NODE_MODULES = REPO / "web" / "node_modules"  # `npm ci --ignore-scripts` in web/ fills it
LOAD_TIMEOUT_MS = 300_000  # a real model over a slow disk
LINE_TIMEOUT_MS = 60_000  # per line translated
KEY_EVERY_S = 0.05  # a key pressed in the textarea this often while the page translates


def chromium_path() -> str | None:
    """Debian's chromium binary, or None."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    return None


@contextmanager
def serve_folder(directory: Path, isolated: bool = False) -> Iterator[str]:
    """Serve `directory` with python's http.server on 127.0.0.1 (a free port) in a thread;
    yields its base URL (``http://127.0.0.1:PORT/``). `isolated`: with the cross-origin
    isolation headers (`ISOLATION_HEADERS`), as the folder's serve.py serves it."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # no line per request on stderr
            pass

        def end_headers(self) -> None:
            if isolated:
                for name, value in ISOLATION_HEADERS.items():
                    self.send_header(name, value)
            super().end_headers()

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
    threads: int = 1  # the wasm threads the page ran on
    input_lags_ms: list[float] = field(default_factory=list)  # key presses while it worked
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
    beam: int | None = None,
    threads: int | None = None,
    press_keys: bool = False,
) -> PageRun:
    """Open the page at `base` in `browser` (a Playwright browser), wait for the model, put
    `lines` in the textarea, choose `target` (a multilingual export; None: the first) and
    `beam` (None: the export's setting, the page's default), press Translate and read the
    output back. `threads`: ask the page for that many wasm threads (``?threads=N``).
    `press_keys`: press a key in the textarea every `KEY_EVERY_S` while it translates, and
    read how long each took to reach the page (`PageRun.input_lags_ms`). `screenshot`: save
    the page once half of the lines are out (mid-translation on a real model)."""
    page = browser.new_page(viewport={"width": 900, "height": 720})
    run = PageRun([], [], [], 0.0, "")
    loaded = threading.Event()
    page.on("pageerror", lambda exc: run.errors.append(str(exc)))

    def on_request(request: Any) -> None:
        run.requests.append(request.url)
        if loaded.is_set():
            run.after_load.append(request.url)

    page.on("request", on_request)
    page.on("console", lambda m: m.type == "error" and run.errors.append(m.text))
    page.goto(base + (f"?threads={threads}" if threads else ""))
    page.wait_for_selector(
        "body[data-state=ready], body[data-state=error]", timeout=LOAD_TIMEOUT_MS
    )
    loaded.set()
    run.load_status = page.inner_text("#load-status")
    if page.get_attribute("body", "data-state") == "error":
        raise LitmtError(f"the page failed to load the model: {run.load_status}")
    run.threads = int(page.get_attribute("body", "data-threads") or 1)
    page.fill("#source", "\n".join(lines))
    if target is not None:
        page.select_option("#target", target)
    if beam is not None:
        page.select_option("#beam", str(beam))
    page.click("#translate")
    done = "body[data-state=done], body[data-state=error]"
    if press_keys:
        page.focus("#source")
        page.keyboard.press("End")
        deadline = time.monotonic() + LINE_TIMEOUT_MS / 1000 * len(lines)
        while page.get_attribute("body", "data-state") == "translating":
            page.keyboard.press("x")
            if time.monotonic() > deadline:
                break
            time.sleep(KEY_EVERY_S)
        run.input_lags_ms = page.evaluate("window.inputLagsMs")
    if screenshot:
        half = f"document.querySelectorAll('#output li').length >= {max(1, len(lines) // 2)}"
        page.wait_for_function(half, timeout=LINE_TIMEOUT_MS * len(lines))
        page.screenshot(path=str(screenshot), full_page=True)
    page.wait_for_selector(done, timeout=LINE_TIMEOUT_MS * len(lines))
    if page.get_attribute("body", "data-state") == "error":
        raise LitmtError(f"the page failed: {page.inner_text('#load-status')}")
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


def python_reference(
    translator: Any,
    lines: Sequence[str],
    target: str | None = None,
    beam: int = 1,
    length_penalty: float = 1.0,
) -> Reference:
    """The search of `translator` (an `OnnxTranslator`, or the torch engine) on `lines` with
    `beam` beams (1: greedy), one sentence per batch as the page decodes, with the ids
    prepared as `Translator.translate` prepares them."""
    route = translator.route(None, target)
    src = [route.source_ids(translator.prepare(x), translator.max_source_tokens) for x in lines]
    prefixes = [route.prefix_ids([]) or [] for _ in lines]
    hyps = translator.search_ids(
        src, beam_size=beam, length_penalty=length_penalty, max_tokens=1, prefixes=prefixes
    )
    out = [h[0].tokens for h in hyps]
    return Reference(src, out, translator.tokenizer.decode_tgt(out))


def compare(
    translator: Any, ref: Reference, run: PageRun, alpha: float | None = None
) -> dict[str, Any]:
    """Line-by-line agreement of the page with python: ``ids_equal`` (source ids), then
    ``same``, ``near_tie`` and ``real`` output lines (see the module docstring; `alpha`: the
    beam's length penalty, which also lets two outputs tie by their GNMT scores; None: greedy),
    with the details of each difference in ``differences``; ``texts_equal``: lines whose text is
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
        # where they part, by python onnxruntime's own log-probabilities; for a beam, also
        # their ranking as finished hypotheses (the parity rule, checks.decode_margins)
        step, ranking = parting_gaps(translator, src, a, b, 0.0 if alpha is None else alpha)
        gap = step if alpha is None else min(step, ranking)
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
    p.add_argument("--beam", type=int, nargs="+", default=[1, 5], help="searches (1: greedy)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="wasm threads")
    p.add_argument("--node-modules", default=str(NODE_MODULES), help="npm's runtime files")
    p.add_argument("--out", default=None, help="keep the hostable folder here (else temporary)")
    p.add_argument("--screenshot", default=None, help="save the page mid-translation (PNG)")
    p.add_argument("--record", default=None, help="also write docs/results/records/<ID>.json")
    return p.parse_args(argv)


def folder_mb(path: Path) -> float:
    """MB of the files under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    from litmt.cli.script.exits import cli_errors
    from litmt.decoding.translator import Translator
    from litmt.deploy.engines.onnx import OnnxTranslator
    from litmt.deploy.export.web import MODEL_DIR, export_web

    args = parse_args(argv)
    rows = []
    with cli_errors(), tempfile.TemporaryDirectory() as tmp:
        lines = read_text_file(args.src, "--src")[: args.lines]
        chromium = chromium_path()
        if chromium is None:
            raise LitmtError("chromium not found (Debian: apt-get install chromium)")
        site = Path(args.out or Path(tmp) / "site")
        export_web(args.ckpt, site, args.node_modules, quantization=args.quantization, force=True)
        translator = OnnxTranslator(site / MODEL_DIR, threads=1)
        alpha = float(translator.meta["decoding"]["length_penalty"])
        torch_engine = Translator.from_checkpoint(args.ckpt, device="cpu")
        torch.set_num_threads(1)  # the references, one sentence at a time
        with serve_folder(site, isolated=True) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for beam in args.beam:
                ref = python_reference(translator, lines, args.target, beam, alpha)
                ref_torch = python_reference(torch_engine, lines, args.target, beam, alpha)
                for threads in args.threads:
                    shot = (
                        args.screenshot
                        if (beam, threads) == (args.beam[-1], args.threads[0])
                        else None
                    )
                    run = translate_in_page(
                        browser, base, lines, args.target, shot, beam, threads, press_keys=True
                    )
                    result = compare(translator, ref, run, alpha if beam > 1 else None)
                    vs_torch = compare_outputs(
                        torch_engine, ref_torch.src_ids, ref_torch.out_ids, run.out_ids, alpha
                    )
                    rows.append((beam, threads, run, result, vs_torch, run.foreign(base)))
            browser.close()
        model_mb = folder_mb(site / MODEL_DIR)
    n = len(lines)
    print(f"lines: {n}  quantization: {args.quantization}  ({rows[0][2].load_status})")
    print(f"model files: {model_mb:.1f} MB\n")
    print(
        "| search | threads | sentences/s | slowest key press (ms) | identical to python "
        "onnxruntime | near-ties | real differences | identical to the torch engine | "
        "near-ties (torch) | requests after load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ok = True
    for beam, threads, run, result, vs_torch, foreign in rows:
        search = "greedy" if beam == 1 else f"beam {beam}"
        lag = max(run.input_lags_ms, default=float("nan"))
        same_torch = n - len(vs_torch.near_ties) - len(vs_torch.real)
        print(
            f"| {search} | {run.threads} | {run.sentences_per_second:.1f} | {lag:.0f} | "
            f"{result['same']}/{n} | {result['near_tie']} | {result['real']} | "
            f"{same_torch}/{n} | {len(vs_torch.near_ties)} | {len(run.after_load)} |"
        )
        for d in result["differences"]:
            print(f"  line {d['line']} ({d['kind']}, step {d['step']}, gap {d['gap']:.2e})")
        for i, gap in vs_torch.real.items():
            print(
                f"  line {i}: the torch engine's output differs (gap {gap:.2e}): {vs_torch.parted[i]}"
            )
        ok = ok and result["ids_equal"] == n and result["real"] == 0 and not foreign
        ok = ok and not run.after_load and not run.errors and run.threads == threads
    if args.record:
        write_page_record(args, rows, model_mb, n, argv)
    return 0 if ok else 1


def write_page_record(args: argparse.Namespace, rows: list, model_mb: float, n: int, argv) -> None:
    """The table as the result record `args.record` (`benchmarks.common.write_result_record`)."""
    values: dict[str, float] = {"lines": n, "model_files_mb": round(model_mb, 1)}
    units = {"lines": "test2016 lines", "model_files_mb": "MB"}
    for beam, threads, run, result, vs_torch, _ in rows:
        key = f"{'greedy' if beam == 1 else f'beam{beam}'}_t{threads}"
        values[f"{key}_sent_per_s"], units[f"{key}_sent_per_s"] = (
            round(run.sentences_per_second, 1), "sentences/s")  # fmt: skip
        values[f"{key}_max_key_ms"] = round(max(run.input_lags_ms, default=0.0), 1)
        units[f"{key}_max_key_ms"] = "ms"
        values[f"{key}_same_as_onnx"], units[f"{key}_same_as_onnx"] = (
            result["same"],
            f"lines of {n}",
        )
        values[f"{key}_same_as_torch"] = n - len(vs_torch.near_ties) - len(vs_torch.real)
        units[f"{key}_same_as_torch"] = f"lines of {n}"
        values[f"{key}_requests_after_load"] = len(run.after_load)
    path = write_result_record(
        args.record,
        f"Offline browser page ({args.quantization if args.quantization != 'none' else 'float32'}), "
        "Web Worker, greedy and beam search",
        "benchmarks.browser_speed",
        sys.argv[1:] if argv is None else argv,
        values,
        units,
        notes="Debian's headless chromium; the folder served with its cross-origin isolation "
        "headers; batch 1; a key pressed in the textarea every 50 ms while it translates.",
    )
    print(f"result record: {path}")


if __name__ == "__main__":
    sys.exit(main())
