"""The real Argos Translate on a multilingual litmt model (``tag_placement=target``): one
package per direction (en→de, en→fr, en→cs), installed with Argos's ``install_from_path`` in
a throwaway virtualenv (scripts/check_argos.py builds it once and caches it), translating a
three-sentence paragraph. Argos splits it, translates the sentences as one batch with the
package's ``target_prefix`` forced on each, joins their pieces and decodes once: no `<2xx>`
may be left anywhere in the text, not just at its start.

Skipped only when the Argos virtualenv cannot be built (no registry, a pip error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_multilingual_checkpoint

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

REPO = Path(__file__).resolve().parents[3]
PARAGRAPH = "A red dog runs. A small cat sleeps here. A young bird sings outside."


def build_three_target_checkpoint(directory: Path) -> Path:
    """The tiny model trained on en→de, en→fr and en→cs at once, `<2xx>` forced as the first
    target token (``tag_placement=target``); saves ``directory/tiny_multi3.ckpt``."""
    return build_tiny_multilingual_checkpoint(
        directory, "target", targets=("de", "fr", "cs"), vocab_size=120, name="tiny_multi3.ckpt"
    )


@pytest.fixture(scope="module")
def check_argos(tmp_path_factory):
    """scripts/check_argos.py as a module, and the Python of its Argos virtualenv."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_argos", REPO / "scripts/check_argos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        python = module.argos_python()
    except module.ArgosVenvError as exc:
        pytest.skip(f"the Argos virtualenv cannot be built: {exc}")
    return module, python


@pytest.mark.slow
def test_argos_translates_a_paragraph_with_no_language_token(check_argos, tmp_path) -> None:
    from litmt.deploy.export.argos import export_argos_package

    module, python = check_argos
    ckpt = build_three_target_checkpoint(tmp_path)
    spacy_dir = module.blank_spacy(python, tmp_path / "spacy-blank")
    packages = []
    for lang in ("de", "fr", "cs"):
        settings = {
            "package_version": "1.0", "argos_version": "1.11", "src_lang": "en",
            "tgt_lang": lang, "spacy_model": str(spacy_dir),
        }  # fmt: skip
        out = tmp_path / f"en-{lang}.argosmodel"
        packages.append(export_argos_package(ckpt, out, settings))
    sentences = PARAGRAPH.replace(". ", ".\n").splitlines()
    jobs = [("en", lang, text) for lang in ("de", "fr", "cs") for text in (PARAGRAPH, *sentences)]
    argos = module.argos_translate(python, packages, jobs, tmp_path / "argos-home")
    assert len(argos["packages"]) == 3, argos["packages"]
    hyps = iter(argos["hyps"])
    paragraphs = {}
    for lang in ("de", "fr", "cs"):
        paragraph, *alone = (next(hyps) for _ in range(1 + len(sentences)))
        assert "<2" not in paragraph and not any("<2" in a for a in alone), (lang, paragraph)
        # every sentence of the paragraph reads as it does translated alone, tag-free
        assert paragraph == " ".join(alone), (lang, paragraph, alone)
        paragraphs[lang] = paragraph
    assert len(set(paragraphs.values())) == 3, paragraphs  # the prefix still picks the language
