"""Loading a checkpoint's model, tokenizer and languages for inference (weights averaged over several)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from litmt.checkpoint.compat import config_differences
from litmt.checkpoint.io import META_KEY, load_checkpoint, model_state_dict
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import BackendError, CheckpointError, ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig


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
    ckpts = load_one_run(path_list, device)
    meta = ckpts[0][META_KEY]
    config = TransformerConfig.from_dict(meta["model_config"])
    if attention is not None:
        for site in ("encoder_self", "decoder_self", "cross"):
            setattr(config.attention, site, attention)
            setattr(config.attention, f"{site}_options", {})
    model = build_model(config, device, check_backends=check_backends, forced=attention)
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


def load_one_run(path_list: Sequence[str | Path], device: torch.device) -> list[dict[str, Any]]:
    """The checkpoints at `path_list`, checked to share one model config and tokenizer.

    Raises:
        CheckpointError: no path, a missing/corrupt file, or checkpoints of different runs
            (the message names the first differing model key).
    """
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
    return ckpts


def build_model(
    config: TransformerConfig,
    device: torch.device,
    *,
    check_backends: bool,
    forced: str | None,
) -> Seq2SeqTransformer:
    """The model of `config`; a kernel checks its packages when built, and (`check_backends`)
    whether it runs on `device`.

    Raises:
        BackendError: the kernel cannot run; unless the kernel was `forced` (``attention=``),
            the message names an exact kernel to decode with instead.
    """
    try:
        model = Seq2SeqTransformer(config)
        if check_backends:
            model.validate_backends(device, training=False)
    except BackendError as err:
        if forced is not None:
            raise
        msg = str(err).splitlines()[0]
        raise BackendError(f"{msg}; decode with an exact kernel: attention=sdpa") from err
    return model


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
