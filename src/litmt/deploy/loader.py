"""The one entry point that loads a translator on any engine: torch (litmt's search), ct2
(CTranslate2) or onnx (litmt's search over onnxruntime sessions, `litmt.deploy.engines.onnx`).

Translate, evaluate, score and serve load through `load_translator` (``litmt.load_translator``).
Its torch engine is `Translator.from_checkpoint`, which the end-of-training step calls
directly (training sits beside deploy, not above it); the one function that reads a checkpoint
for inference under both, and under the ct2 conversion, is `litmt.checkpoint.load.load_model`.

The commands name what they load with `LoadConfig` (conf/load/default.yaml: which checkpoints,
on which device and kernel, which direction) and how with the engine keys (conf/engine/,
`engine_options`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litmt.checkpoint.paths import checkpoint_paths
from litmt.config import build, renamed_keys
from litmt.decoding.translator import Translator
from litmt.deploy.engines.ct2 import CT2Translator
from litmt.deploy.engines.onnx import OnnxTranslator
from litmt.deploy.export.ct2 import is_export_dir
from litmt.deploy.export.onnx import is_onnx_dir
from litmt.errors import ConfigError
from litmt.runtime.threads import use_threads

log = logging.getLogger(__name__)

ENGINES = ("torch", "ct2", "onnx")
# Engine keys (conf/engine/) that changed their name: the old spelling works for one release.
ENGINE_RENAMES = {"ct2_cache": "ct2_cache_dir"}
# The `LoadConfig` keys a job that only moves weights (export, average_checkpoints) refuses.
WEIGHTS_ONLY_IGNORES = (
    "device",
    "attention",
    "ensemble",
    "src_lang",
    "tgt_lang",
    "allow_zero_shot",
)


@dataclass
class LoadConfig:
    """What a command loads: the checkpoint(s), the device and kernel, the direction.

    The keys of conf/load/default.yaml, which translate, evaluate, score, visualize_attention,
    export, average_checkpoints and serve include (``# @package _global_``: users type
    ``ckpt_path=...``, not ``load.ckpt_path=...``).
    """

    ckpt_path: str | list[str] | None = None
    """a .ckpt file, or a list of them (weights averaged, or ensemble=true); engine=ct2: also
    an export directory, engine=onnx: also an ONNX export; or run_dir + average_last instead"""
    run_dir: str | None = None
    """with average_last: a training run directory searched for *.ckpt"""
    average_last: int | None = None
    """average the N most recent checkpoints of run_dir (skips last*.ckpt and avg*.ckpt)"""
    device: str | None = None
    """cpu | cuda | cuda:1 ...; null = cuda when available, else cpu"""
    attention: str | None = None
    """decode with this kernel at every attention site (math, sdpa, ...); null = the
    checkpoint's own"""
    ensemble: bool = False
    """several checkpoints: decode them as an ensemble (mean of their probabilities) instead
    of averaging their weights"""
    src_lang: str | None = None
    """the direction's source language (a multilingual model); null = the model's only one
    (evaluate with data=: the data's)"""
    tgt_lang: str | None = None
    """the direction's target language, e.g. fr: routes to the model's <2fr> token; null =
    the model's only target"""
    allow_zero_shot: bool = False
    """allow a direction the model never trained on (e.g. de->fr of an en->{de,fr} model),
    reported as zero-shot"""

    @classmethod
    def from_cfg(cls, cfg: Any, command: str, ignores: Iterable[str] = ()) -> LoadConfig:
        """The load keys of `command`'s config (they sit at its top level); absent = the
        default, null = None where the field takes it.

        Args:
            cfg: the composed job config.
            command: the command's name, for messages (``export``).
            ignores: the keys `command` does not read; one set to a value is refused rather
                than silently dropped.

        Raises:
            ConfigError: a key of `ignores` is set.
        """
        keys = {f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.name in cfg}
        load = build(cls, keys, command)
        default = cls()
        given = [
            f"{k}={getattr(load, k)}" for k in ignores if getattr(load, k) != getattr(default, k)
        ]
        if given:
            raise ConfigError(f"{command} does not read {', '.join(given)}; drop it")
        return load

    def paths(self) -> list[str]:
        """The checkpoints named (`litmt.checkpoint.paths.checkpoint_paths`).

        Raises:
            ConfigError: nothing given, both forms, or average_last without run_dir.
        """
        return checkpoint_paths(
            self.ckpt_path,
            run_dir=self.run_dir,
            average_last=None if self.average_last is None else int(self.average_last),
        )

    def direction(self) -> dict[str, Any]:
        """`Translator.translate`'s direction keywords (null = the model's only direction)."""
        return {
            "src_lang": self.src_lang or None,
            "tgt_lang": self.tgt_lang or None,
            "allow_zero_shot": bool(self.allow_zero_shot),
        }

    def translator(self, cfg: Any) -> Translator:
        """`load_translator` on `paths` with this device, kernel and ensemble, and the engine
        keys of `cfg` (`engine_options`)."""
        return load_translator(
            self.paths(),
            device=self.device,
            attention=self.attention,
            ensemble=bool(self.ensemble),
            **engine_options(cfg),
        )


def load_translator(
    path: str | Path | Sequence[str | Path],
    *,
    engine: str = "torch",
    device: str | None = None,
    attention: str | None = None,
    threads: int = 0,
    compute_type: str = "default",
    ct2_cache_dir: str | Path | None = None,
    quantization: str = "none",
    ensemble: bool = False,
    cache_dir: str | Path | None = None,
) -> Translator:
    """A `Translator` for `path` on `engine`.

    Args:
        path: torch: a ``.ckpt`` (or a list, weights averaged). ct2: an export directory or
            one ``.ckpt`` (converted into `ct2_cache_dir` on first use). onnx: an ONNX export
            directory or one ``.ckpt`` (exported on first use,
            `litmt.deploy.engines.onnx.default_onnx_cache_dir`).
        engine: "torch", "ct2" or "onnx".
        device: "cpu", "cuda", ... or None for CUDA when available.
        attention: torch only: decode with this kernel everywhere.
        threads: CPU threads for decoding, on any engine (`litmt.runtime.threads`): torch's
            intra-op threads for the process, CTranslate2's on engine=ct2, onnxruntime's
            intra-op threads on engine=onnx; 0 = defaults.
        compute_type: ct2 only: CTranslate2 compute type ("default" = as exported).
        ct2_cache_dir: ct2 only: where checkpoints are converted (default
            `litmt.deploy.engines.cache.default_cache_dir`).
        quantization: ct2 and onnx: quantization of a checkpoint converted on first use
            (onnx: none or int8).
        ensemble: torch only: decode the checkpoints as an ensemble (`litmt.decoding.ensemble`)
            instead of averaging their weights.
        cache_dir: the old name of `ct2_cache_dir`, accepted for one release with a
            deprecation line.
    """
    if cache_dir is not None:
        renamed = renamed_keys(
            {"cache_dir": cache_dir, "ct2_cache_dir": ct2_cache_dir},
            {"cache_dir": "ct2_cache_dir"},
            "load_translator",
        )
        ct2_cache_dir = renamed["ct2_cache_dir"]
    if not isinstance(path, str | Path) and len(path) == 1:
        path = path[0]
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine '{engine}'; valid values: {', '.join(ENGINES)}")
    use_threads(threads)  # torch's threads on either engine: the explorer's model on ct2
    if engine == "torch":
        _refuse_export(path)
        ignored = {
            "compute_type": compute_type if compute_type != "default" else None,
            "ct2_cache_dir": ct2_cache_dir,
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
        raise ConfigError(f"engine={engine} does not ensemble; use engine=torch for ensemble=true")
    if not isinstance(path, str | Path):
        raise ConfigError(
            f"engine={engine} takes one checkpoint or export directory; average checkpoints "
            "first (scripts/average_checkpoints.py) and export the average"
        )
    if attention is not None:
        log.warning("attention=%s is ignored by engine=%s (it has its own)", attention, engine)
    options = {"device": device, "threads": threads, "quantization": quantization}
    if engine == "onnx":
        return _onnx_translator(path, compute_type, ct2_cache_dir, options)
    return CT2Translator.from_pretrained(
        path, compute_type=compute_type, cache_dir=ct2_cache_dir, **options
    )


def _refuse_export(path: str | Path | Sequence[str | Path]) -> None:
    """engine=torch: a CTranslate2 or ONNX export directory is refused, naming its engine."""
    if isinstance(path, str | Path) and is_export_dir(path):
        raise ConfigError(f"{path} is a CTranslate2 export: decode it with engine=ct2")
    if isinstance(path, str | Path) and is_onnx_dir(path):
        raise ConfigError(f"{path} is an ONNX export: decode it with engine=onnx")


def _onnx_translator(
    path: str | Path,
    compute_type: str,
    ct2_cache_dir: str | Path | None,
    options: dict[str, Any],
) -> OnnxTranslator:
    """`load_translator`'s engine=onnx: a warning for the ct2-only keys it was given."""
    if compute_type != "default" or ct2_cache_dir is not None:
        log.warning("compute_type and ct2_cache_dir are ignored by engine=onnx (ct2 keys)")
    return OnnxTranslator.from_pretrained(path, **options)


def engine_options(cfg: Any) -> dict[str, Any]:
    """`load_translator`'s engine keyword arguments from a job config: the keys of conf/engine/
    (``engine``, ``threads``, ``compute_type``, ``ct2_cache_dir``, ``quantization``; missing
    ones take their defaults). The old key ``ct2_cache`` still works, with a deprecation line.
    """
    keys = {key: cfg.get(key) for key in ("ct2_cache", "ct2_cache_dir")}
    keys = renamed_keys({k: v for k, v in keys.items() if v is not None}, ENGINE_RENAMES, "engine")
    return {
        "engine": str(cfg.get("engine") or "torch"),
        "threads": int(cfg.get("threads") or 0),
        "compute_type": str(cfg.get("compute_type") or "default"),
        "ct2_cache_dir": keys.get("ct2_cache_dir"),
        "quantization": str(cfg.get("quantization") or "none"),
    }


__all__ = ["ENGINES", "WEIGHTS_ONLY_IGNORES", "LoadConfig", "engine_options", "load_translator"]
