"""The offline translation page as one hostable folder (``format=web``): the page
(``static/offline/``), an ONNX export (``format=onnx``) in ``model/`` and the browser runtime
in ``vendor/``, so that ``python -m http.server`` (or any static host) serves a page that
translates with no request but to itself.

The runtime files come from the npm registry, pinned in the repository's ``web/package.json``
(+ ``package-lock.json``): ``npm ci --ignore-scripts`` in ``web/`` fetches them into
``web/node_modules``, from where `copy_runtime` takes only what the page loads:

- onnxruntime-web's ESM bundle of the wasm backend and its wasm binary (threaded: the page
  runs it on several threads where it is cross-origin isolated, else on one);
- sentencepiece compiled to wasm (``@sctg/sentencepiece-js``, one ES module with the wasm
  inside), so the page's source ids are the ids of the C++ library python's sentencepiece wraps.
  Its first two lines import node's ``fs`` and ``buffer`` (for its node loaders, which the page
  never calls); a Web Worker has no import map to resolve those names, so the copy imports
  them from ``vendor/node-shims.js`` instead (`SHIMMED_IMPORTS`: exactly those two lines, or
  the export stops with one line naming the package version to check).

The model runs in a Web Worker (``worker.js``). wasm threads need ``SharedArrayBuffer``, which a
browser gives only to a cross-origin isolated page: the server must send
``Cross-Origin-Opener-Policy: same-origin`` and ``Cross-Origin-Embedder-Policy: require-corp``.
The folder carries those headers for the common servers (`HEADER_FILES`): ``_headers``
(Netlify, Cloudflare Pages), ``.htaccess`` (Apache), ``nginx.conf`` (a snippet to include),
``serve.py`` (python's http.server with the headers: ``python serve.py``), and ``HEADERS.md``
saying which to use (GitHub Pages and ``python -m http.server`` cannot send headers: the page
then runs on one thread and says so).

Folder layout::

    OUT/index.html app.js worker.js translator.js style.css
    OUT/_headers .htaccess nginx.conf serve.py HEADERS.md   the isolation headers
    OUT/vendor/   the runtime files + node-shims.js + VERSIONS.json (package, version, licence)
    OUT/model/    the ONNX export (config.json, encoder.onnx, decoder.onnx, src.model, ...)
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from litmt.deploy.export.base import check_replaceable, staged_directory
from litmt.deploy.export.onnx import export_onnx, read_onnx_config
from litmt.errors import ConfigError

PAGE_DIR = Path(__file__).parent / "web_page"
PAGE_FILES = ("index.html", "app.js", "worker.js", "translator.js", "style.css")
# Cross-origin isolation (wasm threads) for the common servers: written next to the page.
HEADER_FILES = ("_headers", ".htaccess", "nginx.conf", "serve.py", "HEADERS.md")
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}
SHIM = "node-shims.js"  # vendor/: what sentencepiece-js's node imports resolve to in the page
# sentencepiece-js's first lines (dist/index.js) -> what the copy imports instead
SHIMMED_IMPORTS = {
    "import * as fs from 'fs';": f"import * as fs from './{SHIM}';",
    "import { Buffer as Buffer$1 } from 'buffer';": f"import {{ Buffer as Buffer$1 }} from './{SHIM}';",
}
MODEL_DIR = "model"  # app.js loads the export from here
VENDOR_DIR = "vendor"  # translator.js imports the runtime from here
# vendor file name -> (npm package, file inside it)
RUNTIME_FILES = {
    "ort.wasm.bundle.min.mjs": ("onnxruntime-web", "dist/ort.wasm.bundle.min.mjs"),
    "ort-wasm-simd-threaded.wasm": ("onnxruntime-web", "dist/ort-wasm-simd-threaded.wasm"),
    "sentencepiece.js": ("@sctg/sentencepiece-js", "dist/index.js"),
    "LICENSE.sentencepiece-js": ("@sctg/sentencepiece-js", "LICENSE"),
}
NPM_HINT = (
    "run `npm ci --ignore-scripts` in the repository's web/ folder "
    "(docs/guide/ship.md#translate-in-the-browser)"
)


def missing_runtime(node_modules: str | Path) -> list[str]:
    """The runtime files (``package/file``) absent from `node_modules`; [] when all are there."""
    root = Path(node_modules)
    return [f"{p}/{f}" for p, f in RUNTIME_FILES.values() if not (root / p / f).is_file()]


def copy_runtime(node_modules: str | Path, vendor: Path) -> dict[str, dict[str, str]]:
    """Copy the runtime files from `node_modules` into `vendor` and write ``VERSIONS.json``.

    Returns:
        package -> {"version", "license"}, as the packages' ``package.json`` say.

    Raises:
        ConfigError: a file is missing (the npm step was not run).
    """
    root = Path(node_modules)
    if missing := missing_runtime(root):
        raise ConfigError(f"{root} lacks {', '.join(missing)}: {NPM_HINT}")
    vendor.mkdir(parents=True, exist_ok=True)
    versions: dict[str, dict[str, str]] = {}
    for name, (package, inside) in RUNTIME_FILES.items():
        meta = json.loads((root / package / "package.json").read_text(encoding="utf-8"))
        versions[package] = {"version": str(meta["version"]), "license": str(meta["license"])}
        if name == "sentencepiece.js":
            text = shim_node_imports((root / package / inside).read_text(encoding="utf-8"))
            (vendor / name).write_text(text, encoding="utf-8")
            continue
        shutil.copyfile(root / package / inside, vendor / name)
    shutil.copyfile(PAGE_DIR / SHIM, vendor / SHIM)
    (vendor / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n", encoding="utf-8")
    return versions


def shim_node_imports(text: str) -> str:
    """sentencepiece-js's module with its node imports (`SHIMMED_IMPORTS`) taken from
    ``./node-shims.js``.

    Raises:
        ConfigError: the module does not start with those imports (another version).
    """
    lines = text.split("\n")
    head = [line.strip() for line in lines[: len(SHIMMED_IMPORTS)]]
    if head != list(SHIMMED_IMPORTS):
        raise ConfigError(
            "@sctg/sentencepiece-js's dist/index.js does not start with the node imports the "
            f"page replaces ({' '.join(SHIMMED_IMPORTS)}); the page is tested with the version "
            "pinned in web/package.json"
        )
    lines[: len(SHIMMED_IMPORTS)] = list(SHIMMED_IMPORTS.values())
    return "\n".join(lines)


def write_header_files(folder: Path) -> None:
    """The cross-origin isolation headers (`ISOLATION_HEADERS`) for the common servers, in
    `folder` (`HEADER_FILES`; module docstring)."""
    pairs = list(ISOLATION_HEADERS.items())
    (folder / "_headers").write_text(
        "/*\n" + "".join(f"  {k}: {v}\n" for k, v in pairs), encoding="utf-8"
    )
    (folder / ".htaccess").write_text(
        "<IfModule mod_headers.c>\n"
        + "".join(f'  Header set {k} "{v}"\n' for k, v in pairs)
        + "</IfModule>\n",
        encoding="utf-8",
    )
    (folder / "nginx.conf").write_text(
        "# include this in the server or location block that serves the folder\n"
        + "".join(f'add_header {k} "{v}" always;\n' for k, v in pairs),
        encoding="utf-8",
    )
    for name in ("serve.py", "HEADERS.md"):  # the server for python, the note for the others
        shutil.copyfile(PAGE_DIR / name, folder / name)


def is_web_dir(path: Path) -> bool:
    """True when `path` is a folder written by `build_web_folder`."""
    return (path / "index.html").is_file() and (path / MODEL_DIR / "config.json").is_file()


def build_web_folder(
    onnx_dir: str | Path, out: str | Path, node_modules: str | Path, force: bool = False
) -> Path:
    """Write the hostable folder `out`: the page, a copy of the ONNX export `onnx_dir` in
    ``model/`` and the runtime from `node_modules` in ``vendor/`` (layout: module docstring).

    Args:
        onnx_dir: a ``format=onnx`` export.
        out: the folder to write; an existing one is replaced only with `force` (and only
            if it is such a folder or empty).
        node_modules: ``web/node_modules`` after ``npm ci`` (`RUNTIME_FILES`).

    Returns:
        `out`.

    Raises:
        ExportError: `onnx_dir` is no ONNX export. ConfigError: runtime files are missing,
        or `out` exists.
    """
    onnx_dir, out = Path(onnx_dir), Path(out)
    read_onnx_config(onnx_dir)
    if missing := missing_runtime(node_modules):
        raise ConfigError(f"{node_modules} lacks {', '.join(missing)}: {NPM_HINT}")
    check_replaceable(out, force, is_web_dir)
    with staged_directory(out) as tmp:
        tmp.chmod(0o755)  # a web server's user must read it (mkdtemp makes it 0700)
        for name in PAGE_FILES:
            shutil.copyfile(PAGE_DIR / name, tmp / name)
        write_header_files(tmp)
        copy_runtime(node_modules, tmp / VENDOR_DIR)
        shutil.copytree(onnx_dir, tmp / MODEL_DIR, copy_function=shutil.copyfile)
        (tmp / MODEL_DIR).chmod(0o755)  # an export written through mkdtemp is 0700
    return out


def export_web(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    node_modules: str | Path,
    *,
    quantization: str = "none",
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
) -> Path:
    """``format=web``: the ONNX export of a checkpoint (several: weights averaged; the options
    are `litmt.deploy.export.onnx.export_onnx`'s) in the hostable folder `out`
    (`build_web_folder`).

    Raises:
        ConfigError: runtime files are missing (checked first, before the export), `out`
        exists, a bad option. ExportError: the model cannot be exported to ONNX.
    """
    if missing := missing_runtime(node_modules):
        raise ConfigError(f"{node_modules} lacks {', '.join(missing)}: {NPM_HINT}")
    check_replaceable(Path(out), force, is_web_dir)
    with tempfile.TemporaryDirectory(prefix="litmt_web_") as tmp:
        onnx_dir = export_onnx(
            ckpt_path, Path(tmp) / MODEL_DIR, quantization=quantization, decoding=decoding
        )
        return build_web_folder(onnx_dir, out, node_modules, force=force)
