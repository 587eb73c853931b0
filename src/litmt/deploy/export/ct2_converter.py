"""A litmt checkpoint as a CTranslate2 converter: ``ctranslate2.converters.Converter`` subclassed.

CTranslate2's base class owns the conversion steps (``convert``: validate the spec, quantise
it with ``optimize``, write ``model.bin``, ``config.json`` and the vocabularies); a converter
only says how to build the spec, in ``_load``. Here that is `litmt.deploy.export.ct2_spec.build_spec`
on the checkpoint's model and tokenizer. `litmt.deploy.export.ct2.export_model` runs it into
a temporary directory and adds the tokenizer and ``litmt.json``.

This module imports ctranslate2 (the ``ct2`` extra): import it only to convert.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctranslate2.converters import Converter

from litmt.checkpoint.load import LoadedModel, load_model
from litmt.deploy.export.ct2_spec import build_spec


class CheckpointConverter(Converter):
    """Converts a litmt ``.ckpt`` (several: weights averaged) with ``convert(output_dir, ...)``.

    Args:
        ckpt_path: a checkpoint or a list of them.

    After ``convert``, `loaded` holds the model and tokenizer the spec was built from.
    """

    def __init__(self, ckpt_path: str | Path | Sequence[str | Path]) -> None:
        self.ckpt_path = ckpt_path
        self.loaded: LoadedModel | None = None

    def _load(self) -> Any:
        """The validated ``TransformerSpec`` of the checkpoint (`ExportError` if it has none)."""
        self.loaded = load_model(self.ckpt_path, map_location="cpu")
        return build_spec(self.loaded.model, self.loaded.tokenizer)


__all__ = ["CheckpointConverter"]
