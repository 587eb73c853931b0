"""The hostable folder of the offline page (`litmt.deploy.export.web`), on a stand-in export and
stand-in npm files: its layout, its refusals, that the page imports only files it ships, the
node imports of sentencepiece-js taken from the shim, and the cross-origin isolation headers
written for each server (the folder's serve.py run for real). The page itself runs in
tests/integration/export/test_offline_page.py (headless Chromium)."""

from __future__ import annotations

import json
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from litmt.deploy.export.base import ExportError
from litmt.deploy.export.onnx import (
    CONFIG_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
)
from litmt.deploy.export.web import (
    HEADER_FILES,
    ISOLATION_HEADERS,
    MODEL_DIR,
    PAGE_DIR,
    PAGE_FILES,
    RUNTIME_FILES,
    SHIM,
    SHIMMED_IMPORTS,
    VENDOR_DIR,
    build_web_folder,
    missing_runtime,
    shim_node_imports,
)
from litmt.errors import ConfigError

SENTENCEPIECE_HEAD = "import * as fs from 'fs';\nimport { Buffer as Buffer$1 } from 'buffer';\n"


def fake_node_modules(root: Path) -> Path:
    """Every runtime file (its own path as content; sentencepiece-js after its real first two
    lines, the node imports) and each package's package.json."""
    for name, (package, inside) in RUNTIME_FILES.items():
        path = root / package / inside
        path.parent.mkdir(parents=True, exist_ok=True)
        head = SENTENCEPIECE_HEAD if name == "sentencepiece.js" else ""
        path.write_text(f"{head}{package}/{inside}")
        meta = {"name": package, "version": "9.9.9", "license": "MIT"}
        (root / package / "package.json").write_text(json.dumps(meta))
    return root


def fake_onnx_export(directory: Path) -> Path:
    directory.mkdir(parents=True)
    config = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    for name in (ENCODER_FILE, DECODER_FILE, "src.model"):
        (directory / name).write_bytes(b"stand-in")
    return directory


def test_the_folder_holds_the_page_the_runtime_and_the_export(tmp_path):
    modules = fake_node_modules(tmp_path / "node_modules")
    out = build_web_folder(fake_onnx_export(tmp_path / "onnx"), tmp_path / "site", modules)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*PAGE_FILES, *HEADER_FILES, MODEL_DIR, VENDOR_DIR]
    )
    for name, (package, inside) in RUNTIME_FILES.items():
        text = (out / VENDOR_DIR / name).read_text()
        if name == "sentencepiece.js":  # its node imports come from the shim (a worker has
            assert text == "\n".join([*SHIMMED_IMPORTS.values(), f"{package}/{inside}"])
            continue  # no import map)
        assert text == f"{package}/{inside}"
    assert (out / VENDOR_DIR / SHIM).read_text() == (PAGE_DIR / SHIM).read_text()
    versions = json.loads((out / VENDOR_DIR / "VERSIONS.json").read_text())
    assert versions["onnxruntime-web"] == {"version": "9.9.9", "license": "MIT"}
    assert (out / MODEL_DIR / DECODER_FILE).read_bytes() == b"stand-in"
    for folder in (out, out / MODEL_DIR):  # a web server running as another user reads it
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_missing_runtime_files_say_how_to_get_them(tmp_path):
    modules = fake_node_modules(tmp_path / "node_modules")
    (modules / "onnxruntime-web" / "dist" / "ort-wasm-simd-threaded.wasm").unlink()
    assert missing_runtime(modules) == ["onnxruntime-web/dist/ort-wasm-simd-threaded.wasm"]
    with pytest.raises(ConfigError, match=r"lacks onnxruntime-web/dist/ort-wasm.*npm ci"):
        build_web_folder(fake_onnx_export(tmp_path / "onnx"), tmp_path / "site", modules)
    assert not (tmp_path / "site").exists()


def test_refuses_what_is_not_an_onnx_export_and_an_existing_folder(tmp_path):
    modules = fake_node_modules(tmp_path / "node_modules")
    (tmp_path / "ct2").mkdir()
    with pytest.raises(ExportError, match="is not a litmt ONNX export"):
        build_web_folder(tmp_path / "ct2", tmp_path / "site", modules)
    onnx = fake_onnx_export(tmp_path / "onnx")
    out = build_web_folder(onnx, tmp_path / "site", modules)
    with pytest.raises(ConfigError, match="already exists; pass force=true"):
        build_web_folder(onnx, out, modules)
    assert build_web_folder(onnx, out, modules, force=True) == out
    with pytest.raises(ConfigError, match="is not a litmt export"):
        build_web_folder(onnx, tmp_path / "onnx", modules, force=True)  # never deletes data


def test_the_page_loads_only_files_the_folder_ships():
    """Every relative URL in the page's HTML and JS (imports, the import map, fetches of
    fixed files) is a page file or a vendor file, so the served folder is complete."""
    shipped = {*PAGE_FILES, *(f"{VENDOR_DIR}/{name}" for name in [*RUNTIME_FILES, SHIM])}
    referenced = set()
    for name in PAGE_FILES:
        text = (PAGE_DIR / name).read_text(encoding="utf-8")
        referenced |= set(re.findall(r"""["']\./([\w./-]+\.(?:m?js|css|wasm))["']""", text))
        referenced |= set(re.findall(r"""["'](vendor/[\w./-]+)["']""", text))
        referenced |= set(re.findall(r"""(?:href|src)="([\w./-]+)\"""", text))
    assert {
        "translator.js",
        "worker.js",
        "vendor/ort.wasm.bundle.min.mjs",
        "vendor/sentencepiece.js",
    } <= referenced
    assert "vendor/ort-wasm-simd-threaded.wasm" in referenced
    assert referenced <= shipped, referenced - shipped


def test_the_page_reads_the_export_format_python_writes():
    js = (PAGE_DIR / "translator.js").read_text(encoding="utf-8")
    assert re.search(r"const FORMAT_VERSION = (\d+);", js).group(1) == str(FORMAT_VERSION)
    assert f'"{FORMAT_NAME}"' in js


def test_another_sentencepiece_js_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="does not start with the node imports"):
        shim_node_imports("import fs from 'node:fs';\nexport const x = 1;\n")
    assert shim_node_imports(SENTENCEPIECE_HEAD + "rest").endswith("\nrest")
    assert f"from './{SHIM}'" in shim_node_imports(SENTENCEPIECE_HEAD)


def test_each_server_gets_the_isolation_headers(tmp_path):
    """_headers, .htaccess and nginx.conf name both headers; the folder's serve.py sends them
    (run for real on a free port)."""
    modules = fake_node_modules(tmp_path / "node_modules")
    out = build_web_folder(fake_onnx_export(tmp_path / "onnx"), tmp_path / "site", modules)
    for name in ("_headers", ".htaccess", "nginx.conf"):
        text = (out / name).read_text()
        for header, value in ISOLATION_HEADERS.items():
            assert re.search(rf"{header}:? \"?{value}\"?", text), (name, header)
    assert "GitHub Pages" in (out / "HEADERS.md").read_text()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(out / "serve.py"), "--port", str(port)],
        cwd=tmp_path,  # serves its own folder wherever it is started
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html") as answer:
                    headers, body = answer.headers, answer.read()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("serve.py did not answer")
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert body == (out / "index.html").read_bytes()
    for header, value in ISOLATION_HEADERS.items():
        assert headers[header] == value
