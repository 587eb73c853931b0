"""Self-contained, safe checkpoints.

A litmt checkpoint is a Lightning `.ckpt` whose extra key ``"litmt"`` holds everything needed
to rebuild the translator without the training config:

    {"format": 1, "model_config": dict, "tokenizer": {"src_model": bytes, "tgt_model": bytes | None},
     "src_lang": str, "tgt_lang": str}

Only plain types and tensors are stored, so files load with ``torch.load(weights_only=True)``:
loading never executes code from the file. Saves are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from litmt.data.tokenizer import Tokenizer
from litmt.errors import BackendError, CheckpointError, ConfigError, LitmtError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.precision import drop_fp8_extra_state

FORMAT_VERSION = 1
META_KEY = "litmt"
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


def average_state_dicts(state_dicts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of several state dicts with identical keys and shapes (float tensors)."""
    if not state_dicts:
        raise CheckpointError("no checkpoints to average")
    keys = set(state_dicts[0])
    for i, sd in enumerate(state_dicts[1:], start=1):
        if set(sd) != keys or any(sd[k].shape != state_dicts[0][k].shape for k in keys):
            raise CheckpointError(
                f"checkpoint #{i + 1} has different weights than #1 (another model config); "
                "only checkpoints of one run can be averaged"
            )
    out = {}
    for k in state_dicts[0]:
        t = state_dicts[0][k]
        if t.is_floating_point():
            out[k] = sum(sd[k].double() for sd in state_dicts).div(len(state_dicts)).to(t.dtype)
        else:
            out[k] = t.clone()
    return out


# Model settings that do not change the weights or what they mean: a run may resume with
# other values (the attention-kernel contract makes backends interchangeable).
RUNTIME_KEYS = frozenset({"attention", "dropout", "attention_dropout", "activation_dropout"})


def _normalized(config: TransformerConfig | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(config, TransformerConfig):
        return config.to_dict()
    try:
        return TransformerConfig.from_dict(dict(config)).to_dict()
    except LitmtError as exc:
        raise CheckpointError(f"{where} has an invalid model config: {exc}") from exc


def config_differences(
    stored: TransformerConfig | dict[str, Any],
    requested: TransformerConfig | dict[str, Any],
    *,
    ignore: frozenset[str] = RUNTIME_KEYS,
) -> list[tuple[str, Any, Any]]:
    """``(key, stored value, requested value)`` for each model setting that differs."""
    a, b = _normalized(stored, "the checkpoint"), _normalized(requested, "the request")
    return [
        (k, a.get(k), b.get(k))
        for k in sorted(set(a) | set(b))
        if k not in ignore and a.get(k) != b.get(k)
    ]


def _pieces(tokenizer: Tokenizer) -> tuple[list[str], list[str]]:
    src = [tokenizer.src.id_to_piece(i) for i in range(tokenizer.src_vocab_size)]
    tgt = [tokenizer.tgt.id_to_piece(i) for i in range(tokenizer.tgt_vocab_size)]
    return src, tgt


def tokenizer_difference(
    stored: Tokenizer | dict[str, Any], requested: Tokenizer | dict[str, Any]
) -> str | None:
    """None when both tokenizers map the same ids to the same pieces, else what differs.

    Identical model bytes match at once; otherwise the vocabularies are compared piece by
    piece (a retrained tokenizer with the same pieces gives the ids the same meaning).
    """
    a = stored if isinstance(stored, Tokenizer) else Tokenizer.from_dict(stored)
    b = requested if isinstance(requested, Tokenizer) else Tokenizer.from_dict(requested)
    if a.to_dict() == b.to_dict():
        return None
    if a.joint != b.joint:
        kinds = ("joint" if a.joint else "separate", "joint" if b.joint else "separate")
        return f"a {kinds[0]} vocabulary in the checkpoint, a {kinds[1]} one requested"
    for side, pa, pb in zip(("source", "target"), _pieces(a), _pieces(b), strict=True):
        if len(pa) != len(pb):
            return f"{side} vocabulary of {len(pa)} pieces in the checkpoint, {len(pb)} requested"
        for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
            if x != y:
                return f"{side} piece {i} is '{x}' in the checkpoint, '{y}' requested"
    return None


def check_compatible(
    ckpt: dict[str, Any],
    model_config: TransformerConfig | dict[str, Any],
    tokenizer: Tokenizer | dict[str, Any],
    *,
    path: str | Path | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> None:
    """Refuse a checkpoint made for another model, tokenizer or language pair than requested.

    Used when training resumes from a checkpoint (``ckpt_path=`` or the run directory's
    ``last.ckpt``): a mismatch would otherwise surface as a size-mismatch traceback from
    ``load_state_dict``, or silently give the ids another meaning. Dropout and attention
    backends may differ (they do not change the weights).

    Args:
        ckpt: a dict from `load_checkpoint`.
        model_config: the run's `TransformerConfig` (or its dict, vocab sizes filled in).
        tokenizer: the run's `Tokenizer` (or its `to_dict()`).
        path: the checkpoint's path, for the message.
        src_lang, tgt_lang: the run's languages (None: not checked).

    Raises:
        CheckpointError: naming the first settings that differ and how to proceed.
    """
    name = str(path) if path is not None else "the checkpoint"
    fix = "use the settings it was trained with, or start a new run in a new hydra.run.dir"
    meta = ckpt.get(META_KEY) or {}
    langs = (meta.get("src_lang"), meta.get("tgt_lang"))
    if src_lang is not None and tgt_lang is not None and langs != (src_lang, tgt_lang):
        raise CheckpointError(
            f"{name} translates {langs[0]}->{langs[1]}, this run {src_lang}->{tgt_lang}; {fix}"
        )
    diff = tokenizer_difference(meta["tokenizer"], tokenizer)
    if diff is not None:
        raise CheckpointError(
            f"{name} was trained with another tokenizer ({diff}); {fix} (data.tokenizer.*)"
        )
    diffs = config_differences(meta["model_config"], model_config)
    if diffs:
        shown = "; ".join(
            f"model.{k}={x} in the checkpoint, {y} requested" for k, x, y in diffs[:2]
        )
        more = f" and {len(diffs) - 2} more" if len(diffs) > 2 else ""
        raise CheckpointError(
            f"{name} was trained with another model config ({shown}{more}); {fix}"
        )


# -- which checkpoints, on which device -----------------------------------------------------
_STEP = re.compile(r"step=(\d+)")


def select_last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The `n` most recent checkpoints under `run_dir` (searched recursively), oldest first.

    ``last*.ckpt`` (a copy of the newest) and ``avg*``/``average*`` files (earlier averages)
    are skipped. "Recent" is the training step in a ``step=N`` file name (Lightning's
    default ``epoch=E-step=N.ckpt``) when every file has one, else the modification time.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"run_dir={root} is not a directory")
    if n < 1:
        raise ConfigError(f"average_last must be at least 1, got {n}")
    files = [
        p
        for p in root.rglob("*.ckpt")
        if not p.name.startswith(("last", "avg", "average")) and p.is_file()
    ]
    if len(files) < n:
        raise ConfigError(
            f"average_last={n} but {root} holds {len(files)} checkpoint(s) "
            "(excluding last*.ckpt and avg*.ckpt)"
        )
    steps = [_STEP.search(p.name) for p in files]
    if all(steps):
        files = [p for _, p in sorted(zip((int(m[1]) for m in steps), files, strict=True))]
    else:
        files.sort(key=lambda p: (p.stat().st_mtime, p.name))
    return files[-n:]


def checkpoint_paths(
    ckpt_path: str | Path | Sequence[str | Path] | None,
    *,
    run_dir: str | Path | None = None,
    average_last: int | None = None,
) -> list[str]:
    """The checkpoints a job names: ``ckpt_path`` (one path or a list, e.g. an OmegaConf
    ListConfig) or ``run_dir`` + ``average_last`` (see `select_last_checkpoints`).

    The one parser of checkpoint arguments behind translate, evaluate, visualize and
    checkpoint averaging. Several paths mean: average their weights (`load_model`).

    Raises:
        ConfigError: nothing given, both forms given, or ``average_last`` without ``run_dir``.
    """
    if ckpt_path and average_last:
        raise ConfigError("give either ckpt_path=... or run_dir=DIR average_last=N, not both")
    if average_last:
        if not run_dir:
            raise ConfigError("average_last=N needs run_dir=<the run's directory>")
        return [str(p) for p in select_last_checkpoints(run_dir, int(average_last))]
    if not ckpt_path:
        raise ConfigError(
            "no checkpoint given: pass ckpt_path=<.ckpt> (or a list), or run_dir=DIR average_last=N"
        )
    if isinstance(ckpt_path, str | Path):
        return [str(ckpt_path)]
    return [str(p) for p in ckpt_path]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device`, or CUDA when available else CPU when None/"auto".

    Raises:
        ConfigError: CUDA was asked for but is not available.
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device} was asked for but CUDA is not available; use device=cpu"
        )
    return dev


# -- the model loader ------------------------------------------------------------------------
@dataclass
class LoadedModel:
    """A model ready for decoding (eval mode, on its device), with its tokenizer and metadata."""

    model: Seq2SeqTransformer
    tokenizer: Tokenizer
    src_lang: str
    tgt_lang: str
    meta: dict[str, Any]


def load_model(
    paths: str | Path | Sequence[str | Path],
    map_location: str | torch.device | None = "cpu",
    *,
    attention: str | None = None,
    check_backends: bool = False,
) -> LoadedModel:
    """Rebuild the model (weights averaged over several checkpoints) and tokenizer.

    The one model loader behind `Translator` (translate, evaluate, the server), the heatmaps
    and checkpoint averaging.

    Args:
        paths: one checkpoint path or a list (weights are averaged; metadata of the first).
        map_location: the device to load to and run on; None or "auto" picks CUDA when
            available (`resolve_device`).
        attention: override every attention site with this backend (e.g. "math"); None keeps
            the backends the checkpoint was trained with.
        check_backends: refuse, now, a kernel that cannot decode on this device (instead of
            failing on the first batch); averaging and export only move weights and skip it.

    Raises:
        CheckpointError: a missing/corrupt file, or checkpoints of different runs.
        ConfigError: CUDA asked for but absent. BackendError: the checkpoint's kernel needs a
        package that is missing or (with `check_backends`) cannot run on this device; the
        message names an exact kernel to pass as `attention`.
    """
    device = resolve_device(map_location)
    path_list = [paths] if isinstance(paths, str | Path) else list(paths)
    if not path_list:
        raise CheckpointError("no checkpoint given (pass ckpt_path=<path to a .ckpt file>)")
    ckpts = [load_checkpoint(p, device) for p in path_list]
    meta = ckpts[0][META_KEY]
    for p, c in zip(path_list[1:], ckpts[1:], strict=True):
        other = c[META_KEY]
        if (
            other["model_config"] == meta["model_config"]
            and other["tokenizer"] == meta["tokenizer"]
        ):
            continue
        diffs = config_differences(other["model_config"], meta["model_config"], ignore=frozenset())
        what = (
            f"another model config (model.{diffs[0][0]}={diffs[0][1]} vs {diffs[0][2]})"
            if diffs
            else "another tokenizer"
        )
        raise CheckpointError(
            f"{p} has {what} than {path_list[0]}; only checkpoints of one run can be averaged"
        )
    config = TransformerConfig.from_dict(meta["model_config"])
    if attention is not None:
        for site in ("encoder_self", "decoder_self", "cross"):
            setattr(config.attention, site, attention)
            setattr(config.attention, f"{site}_options", {})
    try:  # a kernel checks its packages when built, and the device on request
        model = Seq2SeqTransformer(config)
        if check_backends:
            model.validate_backends(device, training=False)
    except BackendError as err:
        if attention is not None:
            raise
        msg = str(err).splitlines()[0]
        raise BackendError(f"{msg}; decode with an exact kernel: attention=sdpa") from err
    states = [model_state_dict(c) for c in ckpts]
    state = states[0] if len(states) == 1 else average_state_dicts(states)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(
            f"weights in {path_list[0]} do not match its model config: {str(exc).splitlines()[0]}"
        ) from exc
    model.to(device).eval()
    tokenizer = Tokenizer.from_dict(meta["tokenizer"])
    if (
        tokenizer.src_vocab_size != config.src_vocab_size
        or tokenizer.tgt_vocab_size != config.tgt_vocab_size
    ):
        raise CheckpointError(
            f"{path_list[0]}: tokenizer vocabulary ({tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}) "
            f"does not match the model's ({config.src_vocab_size}/{config.tgt_vocab_size})"
        )
    return LoadedModel(model, tokenizer, meta["src_lang"], meta["tgt_lang"], meta)


def make_meta(
    config: TransformerConfig, tokenizer: Tokenizer, src_lang: str, tgt_lang: str
) -> dict[str, Any]:
    """The ``"litmt"`` entry written into every checkpoint."""
    return {
        "format": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
    }


def save_model_checkpoint(
    path: str | Path,
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    src_lang: str,
    tgt_lang: str,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a minimal litmt checkpoint (weights + metadata, no optimiser state), atomically.

    Used for averaged checkpoints and tests; training writes full Lightning checkpoints with
    the same ``state_dict`` prefix and ``"litmt"`` entry.
    """
    ckpt = {
        "state_dict": {MODEL_PREFIX + k: v.detach().cpu() for k, v in model.state_dict().items()},
        META_KEY: make_meta(model.config, tokenizer, src_lang, tgt_lang),
        **(extra or {}),
    }
    atomic_save(ckpt, path)
    return Path(path)
