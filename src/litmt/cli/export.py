"""The export command: a checkpoint to a CTranslate2 directory, an Argos Translate package, a
transformers directory, an ONNX directory, or a web folder that translates in the browser
(conf/export.yaml)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litmt.config import build
from litmt.deploy.export.argos import export_argos_package
from litmt.deploy.export.ct2 import export_model
from litmt.deploy.export.hf import export_hf
from litmt.deploy.export.onnx import export_onnx
from litmt.deploy.export.web import export_web
from litmt.deploy.loader import WEIGHTS_ONLY_IGNORES, LoadConfig
from litmt.errors import ConfigError

FORMATS = ("ct2", "argos", "hf", "onnx", "web")


@dataclass(frozen=True)
class ArgosSettings:
    """format=argos only: written to the package's metadata.json."""

    package_version: str = "1.0"
    """the package's version (also names its directory: translate-en_de-1_0)"""
    argos_version: str = "1.9"
    """the Argos Translate version the package is meant for (informational to Argos)"""
    from_name: str | None = None
    """the source language's display name (LibreTranslate's /languages); null: its code"""
    to_name: str | None = None
    """the target language's display name; null: its code"""
    src_lang: str | None = None
    """a multilingual model: the package's source language (an Argos package is one
    direction); null: the model's only source"""
    tgt_lang: str | None = None
    """a multilingual model: the package's target language, forced through metadata.json's
    target_prefix <2xx> (needs data.tag_placement=target); null: the model's only target"""
    sbd_model: str | None = None
    """a MiniSBD .onnx sentence splitter for the source language, bundled as minisbd/ so Argos
    needs no download; null: none"""
    spacy_model: str | None = None
    """a spaCy pipeline directory bundled as spacy/ (e.g. spacy.blank("en").to_disk(DIR)): with
    ARGOS_CHUNK_TYPE=SPACY, Argos splits sentences with it offline; null: none"""


@dataclass(frozen=True)
class CardSettings:
    """format=hf only: the model card (README.md) of the export."""

    test_src: str | None = None
    """a source test file: the card reports BLEU and chrF (sacreBLEU signatures) of the
    export's decoding on it; null: no scores"""
    test_ref: str | None = None
    """its reference file"""
    test_name: str | None = None
    """the test set's name in the card; null: the source file's name"""


@dataclass(frozen=True)
class ExportConfig:
    """The export command's own keys (conf/export.yaml's top level; the checkpoint is the load
    group's, the decoding defaults written with the export the decoding group's)."""

    out: str | None = None
    """the export directory to write (format=argos: the .argosmodel file); required"""
    quantization: str | None = "none"
    """weights as: none (float32) | int8 | int8_float32 | int8_float16 | float16 | bfloat16
    (format=onnx: none | int8, onnxruntime's dynamic quantization); null = none"""
    force: bool = False
    """replace `out` if it exists"""
    format: str = "ct2"
    """ct2: a CTranslate2 directory | argos: an Argos Translate package, a .argosmodel zip
    (joint vocabularies only) | hf: a transformers directory (MarianMTModel for post-norm,
    PegasusForConditionalGeneration for pre-norm; docs/guide/ship.md) | onnx: encoder.onnx +
    decoder.onnx (a decoder step with a key/value cache), config.json and the sentencepiece
    model(s) | web: a static folder (the offline page, onnxruntime-web and the onnx export) that
    translates in the browser (docs/guide/ship.md)"""
    web_runtime: str = "web/node_modules"
    """format=web only: the npm runtime files (onnxruntime-web, sentencepiece-js), from `npm ci
    --ignore-scripts` in web/ (docs/guide/ship.md)"""
    argos: ArgosSettings = field(default_factory=ArgosSettings)
    """format=argos only: written to the package's metadata.json"""
    card: CardSettings = field(default_factory=CardSettings)
    """format=hf only: the model card (README.md) of the export"""

    @classmethod
    def from_cfg(cls, cfg: Any) -> ExportConfig:
        """The fields from the composed export config (the other keys are the groups').

        Raises:
            ConfigError: an unknown argos/card key, null for a key that needs a value, no
                ``out``, or an unknown format.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        values = {k: cfg[k] for k in names if k in cfg}
        values["argos"] = build(ArgosSettings, values.get("argos"), "export.argos")
        values["card"] = build(CardSettings, values.get("card"), "export.card")
        settings = build(cls, values, "export")
        if not settings.out:
            raise ConfigError("no output directory given: pass out=<directory>")
        if settings.format not in FORMATS:
            raise ConfigError(
                f"unknown format '{settings.format}'; valid values: {', '.join(FORMATS)}"
            )
        return settings


def export(cfg: Any) -> Path:
    """The `scripts/export.py` job: ``ckpt_path`` (or ``run_dir`` + ``average_last``: the
    weights averaged), ``out``, ``format``, ``quantization``,
    ``force``, ``decoding``, ``argos``, ``card`` (format=hf).

    Prints the export directory (format=argos: the package file) on stdout (the job's one
    line of data).

    Returns:
        The export directory or package file.
    """
    paths = LoadConfig.from_cfg(cfg, "export", ignores=WEIGHTS_ONLY_IGNORES).paths()
    settings = ExportConfig.from_cfg(cfg)
    ckpt: str | list[str] = paths[0] if len(paths) == 1 else paths
    fmt, out_path = settings.format, str(settings.out)
    options = {
        "quantization": str(settings.quantization or "none"),
        "force": bool(settings.force),
        "decoding": dict(cfg.get("decoding") or {}),
    }
    if fmt == "argos":
        argos = dataclasses.asdict(settings.argos)
        out = export_argos_package(ckpt, out_path, argos, **options)
    elif fmt == "hf":
        if options["quantization"] != "none":
            raise ConfigError("format=hf writes float32 weights; drop quantization")
        card = dataclasses.asdict(settings.card)
        out = export_hf(
            ckpt, out_path, force=options["force"], decoding=options["decoding"], card=card
        )
    elif fmt == "onnx":
        out = export_onnx(ckpt, out_path, **options)
    elif fmt == "web":
        out = export_web(ckpt, out_path, str(settings.web_runtime), **options)
    else:
        out = export_model(ckpt, out_path, **options)
    print(out, flush=True)
    return out
