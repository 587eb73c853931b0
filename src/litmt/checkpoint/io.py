"""Self-contained, safe checkpoints.

A litmt checkpoint is a Lightning `.ckpt` whose extra key ``"litmt"`` holds everything needed
to rebuild the translator without the training config:

    {"format": 1, "model_config": dict, "tokenizer": {"src_model": bytes, "tgt_model": bytes | None},
     "src_lang": str, "tgt_lang": str}

plus, for a multilingual model (`data.directions`), ``"directions": ["en-de", "en-fr", ...]``
and ``"tag_placement": "source" | "target"`` (`LANGUAGE_KEYS`); ``src_lang``/``tgt_lang``
are then its first direction. A checkpoint without them is one pair, as before.

Only plain types and tensors are stored, so files load with ``torch.load(weights_only=True)``:
loading never executes code from the file. Saves are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import CheckpointError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.runtime.fp8 import drop_fp8_extra_state

FORMAT_VERSION = 1
META_KEY = "litmt"
LANGUAGE_KEYS = ("directions", "tag_placement")  # a multilingual model's extra metadata
MODEL_PREFIX = "model."


def atomic_save(obj: Any, path: str | Path) -> None:
    """`torch.save` to a temporary file in the same directory, fsync, then rename over `path`.

    A crash or kill during the write leaves any previous file at `path` intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _first_sentence(exc: BaseException, limit: int = 120) -> str:
    """The first sentence of an exception's message (torch's zip errors run on for lines)."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _crc_failure(path: Path) -> str | None:
    """The first member of the checkpoint's zip archive whose CRC-32 does not match, or None.

    ``torch.load`` does not check the CRCs, so a flipped bit inside tensor data would
    otherwise load silently as different weights. Costs about one more read of the file.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except zipfile.BadZipFile:
        return None  # torch's legacy (non-zip) format: nothing to verify
    except (OSError, RuntimeError, ValueError) as exc:  # e.g. a damaged member header
        return _first_sentence(exc)


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", *, verify: bool = True
) -> dict[str, Any]:
    """Load a checkpoint dict safely (``weights_only=True``), with clear errors.

    Args:
        path: the ``.ckpt`` file.
        map_location: device to load tensors to.
        verify: also check the CRC-32 of every member of the file (detects corrupt tensor data).

    Raises:
        CheckpointError: missing, empty, truncated/corrupt, or containing pickled code.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint not found: {path} (pass ckpt_path=<path to a .ckpt file>)"
        )
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes); the save was interrupted")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc) or "Unsupported" in str(exc):
            raise CheckpointError(
                f"refusing to load {path}: it contains pickled objects other than tensors and "
                "plain types, which could run code when loaded; litmt never writes such files, "
                "so use a checkpoint saved by litmt"
            ) from exc
        raise CheckpointError(f"checkpoint {path} is corrupt ({_first_sentence(exc)})") from exc
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, LookupError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({_first_sentence(exc)}); "
            "use another checkpoint of the run (e.g. a best-*.ckpt) or retrain"
        ) from exc
    bad = _crc_failure(path) if verify else None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupt (checksum mismatch in {bad}); "
            "use another checkpoint of the run (e.g. a best-*.ckpt) or retrain"
        )
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a litmt checkpoint (no state_dict)")
    if META_KEY not in ckpt:
        raise CheckpointError(
            f"{path} is not a litmt checkpoint (no '{META_KEY}' metadata: model config and tokenizer)"
        )
    if ckpt[META_KEY].get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {ckpt[META_KEY].get('format')}, this litmt reads {FORMAT_VERSION}"
        )
    return ckpt


def model_state_dict(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The `Seq2SeqTransformer` weights of a Lightning checkpoint (prefix stripped), without
    the `*._extra_state` entries of an FP8 run's Transformer Engine layers."""
    sd = ckpt["state_dict"]
    return drop_fp8_extra_state(
        {k[len(MODEL_PREFIX) :]: v for k, v in sd.items() if k.startswith(MODEL_PREFIX)}
    )


def weights_digest(path: str | Path) -> str:
    """A SHA-256 of the model weights in the checkpoint at `path` (names, dtypes, shapes and
    bytes): equal digests, equal weights, whatever else the files hold (step, optimizer).

    Raises:
        CheckpointError: a missing or corrupt file (`load_checkpoint`).
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model_state_dict(load_checkpoint(path)).items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make_meta(
    config: TransformerConfig,
    tokenizer: Tokenizer,
    src_lang: str,
    tgt_lang: str,
    languages: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``"litmt"`` entry written into every checkpoint.

    Args:
        languages: a multilingual model's `LANGUAGE_KEYS` (None or {} = one pair).
    """
    meta = {
        "format": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
    }
    meta.update({k: v for k, v in (languages or {}).items() if k in LANGUAGE_KEYS})
    return meta


def languages_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The `LANGUAGE_KEYS` a checkpoint's metadata holds ({} for a one-pair model)."""
    return {k: meta[k] for k in LANGUAGE_KEYS if k in meta}


def save_model_checkpoint(
    path: str | Path,
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    src_lang: str,
    tgt_lang: str,
    extra: dict[str, Any] | None = None,
    languages: dict[str, Any] | None = None,
) -> Path:
    """Write a minimal litmt checkpoint (weights + metadata, no optimiser state), atomically.

    Used for averaged checkpoints and tests; training writes full Lightning checkpoints with
    the same ``state_dict`` prefix and ``"litmt"`` entry.
    """
    ckpt = {
        "state_dict": {MODEL_PREFIX + k: v.detach().cpu() for k, v in model.state_dict().items()},
        META_KEY: make_meta(model.config, tokenizer, src_lang, tgt_lang, languages),
        **(extra or {}),
    }
    atomic_save(ckpt, path)
    return Path(path)
