"""Check a litmt Argos package with the real Argos Translate, offline, next to the ct2 engine.

    python scripts/check_argos.py [--argos-python ARGOS_VENV/bin/python] \\
        [--ckpt model.ckpt --src test.en --ref test.de] [--work /tmp/argos-check]

`--argos-python` is a Python with ``argostranslate`` from the package registry installed.
Without it, the throwaway virtualenv ``$XDG_CACHE_HOME/litmt/argos-venv`` is used, built on
first use by `argos_python` (``python -m venv --system-site-packages``, so the running Python's
torch, CTranslate2 and sentencepiece satisfy Argos's requirements, then ``pip install
argostranslate``; it brings spaCy and Stanza). Without `--ckpt`, the test suite's tiny
synthetic English→German checkpoint is trained (seconds) and scored on 100 of its template
pairs.

Steps: a blank spaCy pipeline is written with that Python (no model download); the
checkpoint is exported with ``format=argos`` bundling it as ``spacy/``; Argos installs the
package with its own ``package.install_from_path`` into private XDG directories and translates
each source line with ``argostranslate.translate.translate`` under ``ARGOS_CHUNK_TYPE=SPACY``
(its default splitter, MiniSBD, downloads a model on first use). The same lines are
translated by litmt's ct2 engine, and both BLEU scores are printed. Argos decodes with its own
settings (beam ``max(1, ARGOS_BEAM_SIZE=4)``, CTranslate2 length penalty 0.2), not the
export's decoding defaults, so the scores differ by design.

The functions (`argos_python`, `blank_spacy`, `argos_translate`) are what the Argos tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Run by the Argos Python: install every package, then translate each job (src, tgt, text).
ARGOS_TRANSLATE = """
import json, sys
import argostranslate.package as package, argostranslate.translate as translate
request = json.load(open(sys.argv[1], encoding="utf-8"))
for path in request["packages"]:
    package.install_from_path(path)
pkgs = package.get_installed_packages()
out = [translate.translate(text, src, tgt) for src, tgt, text in request["jobs"]]
print(json.dumps({"packages": [str(p) for p in pkgs], "hyps": out}))
"""
VENV_READY = ".litmt-argos-ready"  # written once pip has installed argostranslate


class ArgosVenvError(RuntimeError):
    """The Argos virtualenv could not be built (no venv module, no registry, a pip error)."""


def default_venv() -> Path:
    """Where the Argos virtualenv is cached: ``$XDG_CACHE_HOME/litmt/argos-venv``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "litmt" / "argos-venv"


def argos_python(venv: Path | None = None) -> Path:
    """The Python of a virtualenv with ``argostranslate``, built at `venv` (default
    `default_venv`) on first use and reused after. It is built in a temporary directory beside
    `venv` and renamed into place, so concurrent callers never see half a virtualenv.

    Raises:
        ArgosVenvError: ``venv`` or ``pip install argostranslate`` failed; the message ends
            with the tool's last line of output.
    """
    venv = venv or default_venv()
    python = venv / "bin" / "python"
    if (venv / VENV_READY).is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{venv.name}.", dir=venv.parent))
    try:
        new = str(work / "bin" / "python")
        steps = {
            "python -m venv": [sys.executable, "-m", "venv", "--system-site-packages", str(work)],
            "pip install argostranslate": [new, "-m", "pip", "install", "-q", "argostranslate"],
            "import argostranslate": [new, "-c", "import argostranslate.translate"],
        }
        for step, cmd in steps.items():
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                last = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()[-1]
                raise ArgosVenvError(f"{step} failed: {last}")
        (work / VENV_READY).write_text("argostranslate\n", encoding="utf-8")
        try:
            work.rename(venv)  # atomic; another caller may have finished first
        except OSError:
            if not (venv / VENV_READY).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return python


def blank_spacy(python: Path, directory: Path) -> Path:
    """A blank English spaCy pipeline written by `python` to `directory` (no download): with
    ``ARGOS_CHUNK_TYPE=SPACY`` Argos adds spaCy's rule-based sentencizer to it."""
    if not (directory / "config.cfg").is_file():
        code = f"import spacy; spacy.blank('en').to_disk({str(directory)!r})"
        subprocess.run([str(python), "-c", code], check=True)
    return directory


def argos_translate(
    python: Path, packages: list[Path], jobs: list[tuple[str, str, str]], home: Path
) -> dict[str, list[str]]:
    """Install `packages` with Argos's ``install_from_path`` into private XDG directories under
    `home` and translate each job ``(src, tgt, text)`` with ``argostranslate.translate``.

    Returns:
        ``{"packages": [installed package names], "hyps": [one translation per job]}``.

    Raises:
        RuntimeError: Argos failed; the message ends with its stderr.
    """
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ARGOS_CHUNK_TYPE": "SPACY",
    }
    home.mkdir(parents=True, exist_ok=True)
    request = home / "request.json"
    body = {"packages": [str(p) for p in packages], "jobs": jobs}
    request.write_text(json.dumps(body), encoding="utf-8")
    run = subprocess.run(
        [str(python), "-c", ARGOS_TRANSLATE, str(request)], env=env, capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError(f"argostranslate failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def package_metadata(package: Path) -> dict:
    """The ``metadata.json`` of an ``.argosmodel`` zip (its one package directory)."""
    with zipfile.ZipFile(package) as z:
        name = next(n for n in z.namelist() if n.endswith("/metadata.json"))
        return json.loads(z.read(name))


def tiny_data(work: Path) -> tuple[Path, list[str], list[str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from tiny_checkpoint import build_tiny_checkpoint, corpus

    ckpt = work / "tiny.ckpt"
    if not ckpt.exists():
        build_tiny_checkpoint(work)
    en, de = corpus(seed=1)
    return ckpt, en[:100], de[:100]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--argos-python", help="default: the cached virtualenv (built once)")
    parser.add_argument("--ckpt")
    parser.add_argument("--src")
    parser.add_argument("--ref")
    parser.add_argument("--tgt-lang", help="a multilingual checkpoint: the package's target")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--work", default="/tmp/argos-check")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    from litmt.deploy.export.argos import export_argos_package
    from litmt.deploy.export.ct2 import export_model
    from litmt.deploy.loader import load_translator
    from litmt.metrics import corpus_bleu

    if args.ckpt:
        ckpt = Path(args.ckpt)
        src = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.limit]
        ref = Path(args.ref).read_text(encoding="utf-8").splitlines()[: args.limit]
    else:
        ckpt, src, ref = tiny_data(work)
    python = Path(args.argos_python) if args.argos_python else argos_python()
    spacy_dir = blank_spacy(python, work / "spacy-blank")
    package = export_argos_package(
        ckpt,
        work / "model.argosmodel",
        {
            "package_version": "1.0",
            "argos_version": "1.9",
            "spacy_model": str(spacy_dir),
            "tgt_lang": args.tgt_lang,
        },
        force=True,
    )
    meta = package_metadata(package)
    jobs = [(meta["from_code"], meta["to_code"], line) for line in src]
    try:
        argos = argos_translate(python, [package], jobs, work / "argos-home")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    ct2_dir = export_model(ckpt, work / "ct2", force=True)
    ct2 = load_translator(str(ct2_dir), engine="ct2", threads=1)
    route = {"src_lang": meta["from_code"], "tgt_lang": meta["to_code"]}
    ct2_hyps = ct2.translate(src, **route)
    ct2_beam4 = ct2.translate(src, beam_size=4, **route)  # Argos's beam, GNMT length penalty
    same = sum(a == c for a, c in zip(argos["hyps"], ct2_beam4, strict=True))
    print(f"installed: {argos['packages']}")
    for s, a, c in list(zip(src, argos["hyps"], ct2_hyps, strict=True))[:3]:
        print(f"src: {s}\n  argos: {a}\n  ct2:   {c}")
    print(f"sentences: {len(src)}")
    print(f"BLEU argos (beam 4, CT2 length_penalty 0.2): {corpus_bleu(argos['hyps'], ref):.2f}")
    print(f"BLEU litmt ct2 engine (export defaults): {corpus_bleu(ct2_hyps, ref):.2f}")
    print(f"BLEU litmt ct2 engine, beam 4: {corpus_bleu(ct2_beam4, ref):.2f}")
    print(f"argos output identical to the ct2 engine's beam 4: {same}/{len(src)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
