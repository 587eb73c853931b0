"""Where the engines keep the models they convert from a checkpoint on first use: one folder per
engine under the XDG cache (`default_cache_dir`)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir(engine: str = "ct2") -> Path:
    """Where checkpoints are converted for an engine: ``$XDG_CACHE_HOME/litmt/{engine}``
    (ct2; onnx: `litmt.deploy.engines.onnx.default_onnx_cache_dir`)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "litmt" / engine


__all__ = ["default_cache_dir"]
