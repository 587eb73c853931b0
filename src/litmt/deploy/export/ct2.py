"""Export a litmt checkpoint to a CTranslate2 model directory (CPU/GPU inference engine).

The conversion itself is CTranslate2's: `litmt.deploy.export.ct2_converter.CheckpointConverter`
subclasses ``ctranslate2.converters.Converter`` (its ``_load`` builds the spec of
`litmt.deploy.export.ct2_spec`). On top of it this module keeps what litmt adds:

- the export is written into a temporary directory next to `out`, then renamed, so a
  failed export leaves no half-written directory;
- the tokenizer's sentencepiece model(s) and ``litmt.json`` (languages, the source
  checkpoint's sha256, quantization, decoding defaults) go with the weights;
- the conversion cache of the ct2 engine (`cached_export`).

An export directory holds ``model.bin``, ``config.json``, the vocabulary file(s), the
sentencepiece model(s) (``src.model``, ``tgt.model`` when separate) and ``litmt.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from litmt.checkpoint.io import languages_of
from litmt.deploy.export.base import (
    ExportError,
    check_replaceable,
    checked_quantization,
    export_decoding,
    file_sha256,
    staged_directory,
)
from litmt.deploy.export.ct2_spec import CT2_SPECIAL_PIECES, import_ctranslate2

log = logging.getLogger("litmt.deploy.export.ct2")

METADATA_FILE = "litmt.json"
EXPORT_FORMAT = 1
# quantization= values: "none" keeps float32 weights; the others are CTranslate2 model types.
QUANTIZATIONS = ("none", "int8", "int8_float32", "int8_float16", "float16", "bfloat16")


def export_model(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    quantization: str = "none",
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
) -> Path:
    """Convert a checkpoint (several: weights averaged) into a CTranslate2 directory `out`.

    Args:
        ckpt_path: a litmt ``.ckpt`` or a list of them.
        out: the directory to write (must not exist unless `force`).
        quantization: one of `QUANTIZATIONS` (weights stored as int8, float16, ...).
        force: replace an existing `out`.
        decoding: decoding defaults written to the metadata (beam_size, length_penalty,
            max_len_a, max_len_b); missing or None keys take `DEFAULT_DECODING`.

    Returns:
        `out`.

    Raises:
        ExportError: the model cannot be represented. CheckpointError: unreadable checkpoint.
    """
    q = checked_quantization(quantization, QUANTIZATIONS, "ct2")
    out = Path(out)
    check_replaceable(out, force, is_export_dir)
    decoding_defaults = export_decoding(decoding)  # ConfigError before any work
    import_ctranslate2()  # ExportError with the install hint when the ct2 extra is missing
    from litmt.deploy.export.ct2_converter import CheckpointConverter  # imports ctranslate2

    converter = CheckpointConverter(ckpt_path)
    paths = [ckpt_path] if isinstance(ckpt_path, str | Path) else list(ckpt_path)
    with staged_directory(out) as tmp:
        # CTranslate2 validates, quantises and saves (force: it replaces the empty tmp)
        converter.convert(str(tmp), quantization=None if q == "none" else q, force=True)
        loaded = converter.loaded
        assert loaded is not None  # set by converter._load
        meta = {
            "format": EXPORT_FORMAT,
            "src_lang": loaded.src_lang,
            "tgt_lang": loaded.tgt_lang,
            "checkpoints": [Path(p).name for p in paths],
            "checkpoint_sha256": file_sha256(paths),
            "quantization": q,
            "max_positions": loaded.model.config.max_positions,
            "joint_vocabulary": loaded.tokenizer.joint,
            "special_tokens": {str(i): p for i, p in CT2_SPECIAL_PIECES.items()},
            "decoding": decoding_defaults,
            "model_config": loaded.model.config.to_dict(),
            # a multilingual model's directions and tag placement: the engine routes to the
            # <2xx> token, as a source token or CTranslate2's target_prefix
            **languages_of(loaded.meta),
        }
        loaded.tokenizer.save(tmp)
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    log.info("exported %s (%s) to %s", paths[0], q, out)
    return out


def is_export_dir(path: str | Path) -> bool:
    """True when `path` is a directory written by `export_model`."""
    p = Path(path)
    return p.is_dir() and (p / METADATA_FILE).is_file() and (p / "model.bin").is_file()


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``litmt.json`` of an export directory.

    Raises:
        ExportError: not an export directory, or written by another format version.
    """
    p = Path(path)
    if not is_export_dir(p):
        raise ExportError(
            f"{p} is not a litmt CTranslate2 export (no {METADATA_FILE} and model.bin); "
            "create one with scripts/export.py"
        )
    meta = json.loads((p / METADATA_FILE).read_text(encoding="utf-8"))
    if meta.get("format") != EXPORT_FORMAT:
        raise ExportError(
            f"{p} has export format {meta.get('format')}, this litmt reads {EXPORT_FORMAT}"
        )
    return meta


def cached_export(ckpt_path: str | Path, cache_dir: str | Path, quantization: str = "none") -> Path:
    """The export of `ckpt_path` in `cache_dir`, converted on first use.

    The cache entry is named by the checkpoint's sha256 and the quantization, so a changed
    checkpoint is converted again.
    """
    q = checked_quantization(quantization, QUANTIZATIONS, "ct2")
    digest = file_sha256(ckpt_path)
    target = Path(cache_dir) / f"{Path(ckpt_path).stem}-{digest[:16]}-{q}"
    if is_export_dir(target):
        return target
    log.info("converting %s for the ct2 engine into %s (first use)", ckpt_path, target)
    return export_model(ckpt_path, target, quantization=q, force=True)


__all__ = [
    "QUANTIZATIONS",
    "cached_export",
    "export_model",
    "is_export_dir",
    "read_metadata",
]
