"""Check a litmt Argos package with the real Argos Translate, offline, next to the ct2 engine.

    python scripts/check_argos.py --argos-python ARGOS_VENV/bin/python \\
        [--ckpt model.ckpt --src test.en --ref test.de] [--work /tmp/argos-check]

`--argos-python` is a Python with ``argostranslate`` from the package registry installed (a
throwaway virtualenv; it brings spaCy). Without `--ckpt`, the test suite's tiny synthetic
English→German checkpoint is trained (seconds) and scored on 100 of its template pairs.

Steps: a blank spaCy pipeline is written with that Python (no model download); the
checkpoint is exported with ``format=argos`` bundling it as ``spacy/``; Argos installs the
package with its own ``package.install_from_path`` into private XDG directories and translates
each source line with ``argostranslate.translate.translate`` under ``ARGOS_CHUNK_TYPE=SPACY``
(its default splitter, MiniSBD, downloads a model on first use). The same lines are
translated by litmt's ct2 engine, and both BLEU scores are printed. Argos decodes with its own
settings (beam ``max(1, ARGOS_BEAM_SIZE=4)``, CTranslate2 length penalty 0.2), not the
export's decoding defaults, so the scores differ by design.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ARGOS_TRANSLATE = """
import json, sys
import argostranslate.package as package, argostranslate.translate as translate
package.install_from_path(sys.argv[1])
pkgs = package.get_installed_packages()
lines = json.load(open(sys.argv[2], encoding="utf-8"))
src, tgt = pkgs[0].from_code, pkgs[0].to_code
out = [translate.translate(line, src, tgt) for line in lines]
print(json.dumps({"packages": [str(p) for p in pkgs], "hyps": out}))
"""


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
    parser.add_argument("--argos-python", required=True)
    parser.add_argument("--ckpt")
    parser.add_argument("--src")
    parser.add_argument("--ref")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--work", default="/tmp/argos-check")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    from litmt.deploy.argos_package import export_argos_package
    from litmt.deploy.ct2_export import export_model
    from litmt.deploy.engines import load_translator
    from litmt.metrics import corpus_bleu

    if args.ckpt:
        ckpt = Path(args.ckpt)
        src = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.limit]
        ref = Path(args.ref).read_text(encoding="utf-8").splitlines()[: args.limit]
    else:
        ckpt, src, ref = tiny_data(work)
    spacy_dir = work / "spacy-blank"
    subprocess.run(
        [args.argos_python, "-c", f"import spacy; spacy.blank('en').to_disk({str(spacy_dir)!r})"],
        check=True,
    )
    package = export_argos_package(
        ckpt,
        work / "model.argosmodel",
        {"package_version": "1.0", "argos_version": "1.9", "spacy_model": str(spacy_dir)},
        force=True,
    )
    home = work / "argos-home"
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ARGOS_CHUNK_TYPE": "SPACY",
    }
    (work / "src.json").write_text(json.dumps(src), encoding="utf-8")
    run = subprocess.run(
        [args.argos_python, "-c", ARGOS_TRANSLATE, str(package), str(work / "src.json")],
        env=env,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        print(run.stderr[-3000:], file=sys.stderr)
        return 1
    argos = json.loads(run.stdout.strip().splitlines()[-1])
    ct2_dir = export_model(ckpt, work / "ct2", force=True)
    ct2 = load_translator(str(ct2_dir), engine="ct2", threads=1)
    ct2_hyps = ct2.translate(src)
    ct2_beam4 = ct2.translate(src, beam_size=4)  # Argos's beam, litmt's GNMT length penalty
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
