"""The one entry point that loads a translator on any engine: torch (litmt's search) or ct2.

Translate, evaluate, score and serve load through `load_translator` (``litmt.load_translator``).
Its torch engine is `Translator.from_checkpoint`, which the end-of-training step calls
directly (training sits beside deploy, not above it); the one function that reads a checkpoint
for inference under both, and under the ct2 conversion, is `litmt.checkpoint.load.load_model`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from litmt.decoding.translator import Translator
from litmt.deploy.ct2_engine import CT2Translator
from litmt.deploy.ct2_export import (
    is_export_dir,
)
from litmt.errors import ConfigError
from litmt.runtime.threads import use_threads

log = logging.getLogger(__name__)

ENGINES = ("torch", "ct2")


def load_translator(
    path: str | Path | Sequence[str | Path],
    *,
    engine: str = "torch",
    device: str | None = None,
    attention: str | None = None,
    threads: int = 0,
    compute_type: str = "default",
    cache_dir: str | Path | None = None,
    quantization: str = "none",
    ensemble: bool = False,
) -> Translator:
    """A `Translator` for `path` on `engine`.

    Args:
        path: torch: a ``.ckpt`` (or a list, weights averaged). ct2: an export directory or
            one ``.ckpt`` (converted into `cache_dir` on first use).
        engine: "torch" or "ct2".
        device: "cpu", "cuda", ... or None for CUDA when available.
        attention: torch only: decode with this kernel everywhere.
        threads: CPU threads for decoding, on either engine (`litmt.runtime.threads`): torch's
            intra-op threads for the process, and CTranslate2's on engine=ct2; 0 = defaults.
        compute_type: ct2 only: CTranslate2 compute type ("default" = as exported).
        cache_dir: ct2 only: where checkpoints are converted (default `default_cache_dir`).
        quantization: ct2 only: quantization of a checkpoint converted on first use.
        ensemble: torch only: decode the checkpoints as an ensemble (`litmt.decoding.ensemble`)
            instead of averaging their weights.
    """
    if not isinstance(path, str | Path) and len(path) == 1:
        path = path[0]
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine '{engine}'; valid values: {', '.join(ENGINES)}")
    use_threads(threads)  # torch's threads on either engine: the explorer's model on ct2
    if engine == "torch":
        if isinstance(path, str | Path) and is_export_dir(path):
            raise ConfigError(f"{path} is a CTranslate2 export: decode it with engine=ct2")
        ignored = {
            "compute_type": compute_type if compute_type != "default" else None,
            "ct2_cache": cache_dir,
            "quantization": quantization if quantization != "none" else None,
        }
        ignored = {key: value for key, value in ignored.items() if value is not None}
        if ignored:
            log.warning(
                "%s ignored by engine=torch (ct2-only options)",
                ", ".join(f"{key}={value}" for key, value in ignored.items()),
            )
        return Translator.from_checkpoint(
            path, device=device, attention=attention, ensemble=ensemble
        )
    if ensemble:
        raise ConfigError("engine=ct2 does not ensemble; use engine=torch for ensemble=true")
    if not isinstance(path, str | Path):
        raise ConfigError(
            "engine=ct2 takes one checkpoint or export directory; average checkpoints "
            "first (scripts/average_checkpoints.py) and export the average"
        )
    if attention is not None:
        log.warning("attention=%s is ignored by engine=ct2 (CTranslate2 has its own)", attention)
    return CT2Translator.from_pretrained(
        path,
        device=device,
        compute_type=compute_type,
        threads=threads,
        cache_dir=cache_dir,
        quantization=quantization,
    )


def direction_options(cfg: Any) -> dict[str, Any]:
    """A command's direction keys (``src_lang``, ``tgt_lang``, ``allow_zero_shot``; null =
    the model's only direction) as `Translator.translate` keyword arguments."""
    return {
        "src_lang": cfg.get("src_lang") or None,
        "tgt_lang": cfg.get("tgt_lang") or None,
        "allow_zero_shot": bool(cfg.get("allow_zero_shot") or False),
    }


def engine_options(cfg: Any) -> dict[str, Any]:
    """`load_translator` keyword arguments from a job config (translate/evaluate/serve keys).

    Keys: ``engine``, ``device``, ``attention``, ``threads``, ``compute_type``, ``ct2_cache``,
    ``quantization`` (conf/engine/), ``ensemble`` (missing ones take their defaults).
    """
    return {
        "engine": str(cfg.get("engine") or "torch"),
        "device": cfg.get("device"),
        "attention": cfg.get("attention"),
        "threads": int(cfg.get("threads") or 0),
        "compute_type": str(cfg.get("compute_type") or "default"),
        "cache_dir": cfg.get("ct2_cache"),
        "quantization": str(cfg.get("quantization") or "none"),
        "ensemble": bool(cfg.get("ensemble")),
    }
