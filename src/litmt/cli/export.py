"""The export command: a checkpoint to a CTranslate2 directory (conf/export.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litmt.deploy.ct2_export import export_model
from litmt.errors import ConfigError


def export(cfg: Any) -> Path:
    """The `scripts/export.py` job: ``ckpt_path``, ``out``, ``quantization``, ``force``, ``decoding``.

    Prints the export directory on stdout (the job's one line of data).

    Returns:
        The export directory.
    """
    if not cfg.get("ckpt_path"):
        raise ConfigError("no checkpoint given: pass ckpt_path=<path to a .ckpt file>")
    if not cfg.get("out"):
        raise ConfigError("no output directory given: pass out=<directory>")
    ckpt = cfg.ckpt_path
    ckpt = [str(p) for p in ckpt] if not isinstance(ckpt, str) else ckpt
    decoding = dict(cfg.get("decoding") or {})
    out = export_model(
        ckpt,
        str(cfg.out),
        quantization=str(cfg.get("quantization") or "none"),
        force=bool(cfg.get("force", False)),
        decoding=decoding,
    )
    print(out, flush=True)
    return out
