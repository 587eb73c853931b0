"""Compatibility of checkpoints: which model-config and tokenizer differences make two checkpoints one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litmt.checkpoint.io import META_KEY
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import CheckpointError, LitmtError
from litmt.models import TransformerConfig

# The one list of "runtime" model keys: keys of the `model` config group that do not change the
# weights or what they mean. A run may resume or fine-tune with other values (the
# attention-kernel contract makes backends interchangeable), and a checkpoint is compatible
# whatever they were. (`compile` is not a model key: it is `module.compile`.)
RUNTIME_KEYS = frozenset(
    {"attention", "dropout", "attention_dropout", "activation_dropout", "word_dropout"}
)


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
    src = tokenizer.src_pieces(range(tokenizer.src_vocab_size))
    return src, tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))


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
