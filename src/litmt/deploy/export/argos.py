"""Export a litmt checkpoint as an Argos Translate package (``.argosmodel``).

Argos Translate (and LibreTranslate, which serves Argos packages) installs a package with
``argostranslate.package.install_from_path``: it checks that the file is a zip and extracts
it into its packages directory. Each directory there is one installed package, read by
``argostranslate.package.Package``:

- ``metadata.json``: ``package_version``, ``argos_version``, ``from_code``/``from_name``,
  ``to_code``/``to_name`` (``type`` defaults to ``translate``);
- ``model/``: a CTranslate2 model directory (``ctranslate2.Translator(package/"model")``);
- ``sentencepiece.model``: one sentencepiece model, used for both sides (encode the source,
  decode the target pieces);
- optionally ``minisbd/<lang>.onnx``: the MiniSBD sentence splitter, which Argos otherwise
  downloads on first use; or ``spacy/``: a spaCy pipeline, which Argos loads (adding spaCy's
  rule-based ``sentencizer``) when run with ``ARGOS_CHUNK_TYPE=SPACY``
  (docs/guide/ship.md#argos-translate-and-libretranslate).

A multilingual model (`data.directions`) gives one package per direction (``argos.src_lang``,
``argos.tgt_lang``) and needs ``data.tag_placement=target``: Argos adds nothing to the source,
so a model with source-side tokens is refused with one line. Argos forces ``metadata.json``'s
``target_prefix`` (``<2fr>``) as the first target token of every sentence, but it translates a
paragraph's sentences as one batch, joins their pieces (CTranslate2 returns each with its
prefix), decodes once and strips the prefix only from the start of the text
(``argostranslate/translate.py``, ``apply_packaged_translation``): ``<2fr>`` would stay before
every later sentence. Argos has no source prefix and no per-sentence strip, so the package's
own decoding drops it: in its ``sentencepiece.model`` the language tokens are control pieces
(`package_sentencepiece`), which sentencepiece's ``decode_pieces`` (Argos >= 1.10; 1.9 joins
the pieces itself and would keep them) removes as it removes ``<s>``. Pieces and ids are
unchanged, so the CTranslate2 vocabulary still matches; only a literal ``<2fr>`` typed in the
source is now split into ordinary pieces (the model never saw a tag there).

So the zip holds one top-level directory (``translate-<src>_<tgt>-<version>``, as Argos's own
packages are named) with those entries. One sentencepiece model means a joint vocabulary:
a checkpoint with separate source and target vocabularies is refused.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from litmt.checkpoint.load import load_model
from litmt.data.directions import lang_tag, tag_language
from litmt.data.tokenization.segmentation import model_proto
from litmt.decoding.languages import Languages
from litmt.deploy.export.ct2 import export_model, read_metadata
from litmt.errors import ConfigError

PACKAGE_SUFFIX = ".argosmodel"
SEPARATE_VOCABULARIES = (
    "cannot export an Argos package: the checkpoint has separate source and target "
    "sentencepiece vocabularies, and an Argos package holds one sentencepiece.model; "
    "train with a joint vocabulary (data.tokenizer.joint=true) or use format=ct2"
)


def package_dir_name(src_lang: str, tgt_lang: str, package_version: str) -> str:
    """Argos's naming of a package directory: ``translate-en_de-1_0``."""
    return f"translate-{src_lang}_{tgt_lang}-{package_version.replace('.', '_')}"


def package_sentencepiece(model: bytes) -> bytes:
    """The package's ``sentencepiece.model``: the serialized `model` with every user-defined
    language token (``<2de>``, `tag_language`) turned into a control piece, which
    sentencepiece decodes to nothing; pieces, ids and scores stay as they are."""
    proto = model_proto(model)
    kinds = type(proto).SentencePiece
    for piece in proto.pieces:
        if piece.type == kinds.USER_DEFINED and tag_language(piece.piece) is not None:
            piece.type = kinds.CONTROL
    return proto.SerializeToString()


def argos_metadata(meta: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata.json`` from the export's ``litmt.json`` and the ``argos.*`` settings.

    A null ``from_name``/``to_name`` is the language code. A multilingual export's package
    is the direction ``argos.src_lang``→``argos.tgt_lang``, with its ``target_prefix``.

    Raises:
        ConfigError: a direction the model does not know, or a source-side language token.
    """
    src, tgt = str(meta["src_lang"]), str(meta["tgt_lang"])
    extra: dict[str, Any] = {}
    if meta.get("directions"):
        languages = Languages.from_meta(meta)
        pairs = languages.pairs()
        src = str(settings.get("src_lang") or "")
        tgt = str(settings.get("tgt_lang") or "")
        if not tgt:
            raise ConfigError(
                f"this model translates {languages.names()}; an Argos package is one direction: "
                f"pass argos.tgt_lang=XX (and argos.src_lang=XX)"
            )
        src = src or next((s for s, t in pairs if t == tgt), "")
        if (src, tgt) not in pairs:
            raise ConfigError(f"this model translates {languages.names()}, not {src}-{tgt}")
        if languages.placement != "target":
            raise ConfigError(
                "cannot export an Argos package of a model with source-side language tokens "
                "(Argos forces a target_prefix but adds nothing to the source); train with "
                "data.tag_placement=target, or serve the model with scripts/serve.py"
            )
        extra["target_prefix"] = lang_tag(tgt)
    return {
        "package_version": str(settings["package_version"]),
        "argos_version": str(settings["argos_version"]),
        "from_code": src,
        "from_name": str(settings.get("from_name") or src),
        "to_code": tgt,
        "to_name": str(settings.get("to_name") or tgt),
        "type": "translate",
        "links": [],
        **extra,
    }


def export_argos_package(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    settings: Mapping[str, Any],
    *,
    quantization: str = "none",
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
) -> Path:
    """Write the Argos package `out` (a ``.argosmodel`` zip) for a checkpoint.

    Args:
        ckpt_path: a litmt ``.ckpt`` or a list of them (weights averaged).
        out: the zip to write (must not exist unless `force`).
        settings: conf/export.yaml's ``argos`` block: package_version, argos_version,
            from_name, to_name, sbd_model, spacy_model.
        quantization, decoding: as for `export_model`.

    Raises:
        ConfigError: `out` exists, separate vocabularies, a missing ``sbd_model`` file or
            ``spacy_model`` directory.
    """
    out = Path(out)
    if out.suffix != PACKAGE_SUFFIX:
        raise ConfigError(f"an Argos package is a {PACKAGE_SUFFIX} file; got out={out}")
    if out.exists() and not force:
        raise ConfigError(f"{out} already exists; pass force=true to replace it")
    if out.exists() and not out.is_file():
        raise ConfigError(f"{out} exists and is not a file")
    sbd_model = settings.get("sbd_model")
    if sbd_model and not Path(sbd_model).is_file():
        raise ConfigError(f"argos.sbd_model={sbd_model} is not a file (a MiniSBD .onnx model)")
    spacy_model = settings.get("spacy_model")
    if spacy_model and not (Path(spacy_model) / "config.cfg").is_file():
        raise ConfigError(
            f"argos.spacy_model={spacy_model} is not a spaCy pipeline directory (no config.cfg)"
        )
    first = ckpt_path if isinstance(ckpt_path, str | Path) else ckpt_path[0]
    tokenizer = load_model(first, map_location="cpu").tokenizer
    if not tokenizer.joint:  # refuse before any work
        raise ConfigError(SEPARATE_VOCABULARIES)
    if tokenizer.vocab is not None:  # Argos reads ids from sentencepiece.model itself
        raise ConfigError(
            "format=argos needs a tokenizer whose ids are its sentencepiece ids; a model "
            "imported from transformers (vocab.json ids) exports with format=ct2 or format=hf"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model_dir = export_model(
            ckpt_path, work / "model", quantization=quantization, decoding=decoding
        )
        meta = read_metadata(model_dir)
        metadata = argos_metadata(meta, settings)
        root = package_dir_name(
            metadata["from_code"], metadata["to_code"], metadata["package_version"]
        )
        sentencepiece = (model_dir / "src.model").read_bytes()
        if metadata.get("target_prefix"):  # Argos keeps it before every later sentence
            sentencepiece = package_sentencepiece(sentencepiece)
        (work / "sentencepiece.model").write_bytes(sentencepiece)
        (model_dir / "src.model").unlink()
        tmp_zip = work / out.name
        with zipfile.ZipFile(tmp_zip, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{root}/metadata.json", json.dumps(metadata, indent=2) + "\n")
            z.write(work / "sentencepiece.model", f"{root}/sentencepiece.model")
            for f in sorted(model_dir.iterdir()):
                z.write(f, f"{root}/model/{f.name}")
            if sbd_model:
                z.write(sbd_model, f"{root}/minisbd/{Path(sbd_model).name}")
            if spacy_model:
                for f in sorted(Path(spacy_model).rglob("*")):
                    if f.is_file():
                        z.write(f, f"{root}/spacy/{f.relative_to(spacy_model).as_posix()}")
        tmp_zip.replace(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


__all__ = [
    "PACKAGE_SUFFIX",
    "argos_metadata",
    "export_argos_package",
    "package_dir_name",
    "package_sentencepiece",
]
