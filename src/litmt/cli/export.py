"""The export command: a checkpoint to a CTranslate2 directory, an Argos Translate package, a
transformers directory, an ONNX directory, or a web folder that translates in the browser
(conf/export.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litmt.deploy.export.argos import export_argos_package
from litmt.deploy.export.ct2 import export_model
from litmt.deploy.export.hf import export_hf
from litmt.deploy.export.onnx import export_onnx
from litmt.deploy.export.web import export_web
from litmt.deploy.loader import WEIGHTS_ONLY_IGNORES, LoadConfig
from litmt.errors import ConfigError

FORMATS = ("ct2", "argos", "hf", "onnx", "web")


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
    if not cfg.get("out"):
        raise ConfigError("no output directory given: pass out=<directory>")
    ckpt: str | list[str] = paths[0] if len(paths) == 1 else paths
    fmt = str(cfg.get("format") or "ct2")
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format '{fmt}'; valid values: {', '.join(FORMATS)}")
    options = {
        "quantization": str(cfg.get("quantization") or "none"),
        "force": bool(cfg.get("force", False)),
        "decoding": dict(cfg.get("decoding") or {}),
    }
    if fmt == "argos":
        out = export_argos_package(ckpt, str(cfg.out), dict(cfg.argos), **options)
    elif fmt == "hf":
        if options["quantization"] != "none":
            raise ConfigError("format=hf writes float32 weights; drop quantization")
        card = dict(cfg.get("card") or {})
        out = export_hf(
            ckpt, str(cfg.out), force=options["force"], decoding=options["decoding"], card=card
        )
    elif fmt == "onnx":
        out = export_onnx(ckpt, str(cfg.out), **options)
    elif fmt == "web":
        out = export_web(
            ckpt, str(cfg.out), str(cfg.get("web_runtime") or "web/node_modules"), **options
        )
    else:
        out = export_model(ckpt, str(cfg.out), **options)
    print(out, flush=True)
    return out
