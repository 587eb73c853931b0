"""Checkpoint averaging: the parameter-wise mean of several checkpoints of one run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from litmt.checkpoint.io import languages_of, save_model_checkpoint
from litmt.checkpoint.load import load_model


# -- checkpoint averaging -----------------------------------------------------------------
def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> Path:
    """Average the weights of `paths` (one run) into a self-contained checkpoint `output`."""
    loaded = load_model(list(paths), map_location="cpu")
    return save_model_checkpoint(
        output,
        loaded.model,
        loaded.tokenizer,
        loaded.src_lang,
        loaded.tgt_lang,
        extra={"averaged_from": [str(p) for p in paths]},
        languages=languages_of(loaded.meta),
    )
