"""The import_hf command: a transformers Marian directory to a litmt checkpoint
(conf/import_hf.yaml; the mapping is `litmt.checkpoint.hf_import`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.io import save_model_checkpoint
from litmt.config import job_config
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer


@dataclass(frozen=True)
class ImportHFConfig:
    """The import_hf command's keys (conf/import_hf.yaml)."""

    model_dir: str | None = None
    """the transformers directory to import (nothing is downloaded); required"""
    out: str | None = None
    """the litmt checkpoint to write (.ckpt); required"""
    src_lang: str | None = None
    """source language code; null: tokenizer_config.json's source_lang, else src"""
    tgt_lang: str | None = None
    """target language code; null: tokenizer_config.json's target_lang, else tgt"""
    force: bool = False
    """replace `out` if it exists"""


def import_hf(cfg: Any) -> Path:
    """The `scripts/import_hf.py` job (`ImportHFConfig`). Prints the checkpoint path on stdout.

    Returns:
        The checkpoint written.
    """
    settings = job_config(ImportHFConfig, cfg, "import_hf")
    if not settings.model_dir:
        raise ConfigError("no model directory given: pass model_dir=<transformers directory>")
    if not settings.out:
        raise ConfigError("no output given: pass out=<path of the .ckpt to write>")
    out = Path(settings.out)
    if out.exists() and not settings.force:
        raise ConfigError(f"{out} exists; pass force=true to replace it")
    imported = read_hf_dir(settings.model_dir, settings.src_lang, settings.tgt_lang)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    source = {"model_dir": settings.model_dir, "format": "transformers-marian"}
    save_model_checkpoint(
        out, model, imported.tokenizer, imported.src_lang, imported.tgt_lang,
        extra={"imported_from": source}, languages=imported.languages,
    )  # fmt: skip
    print(out, flush=True)
    return out
