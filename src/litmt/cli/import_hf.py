"""The import_hf command: a transformers Marian directory to a litmt checkpoint
(conf/import_hf.yaml; the mapping is `litmt.checkpoint.hf_import`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.io import save_model_checkpoint
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer


def import_hf(cfg: Any) -> Path:
    """The `scripts/import_hf.py` job: ``model_dir``, ``out``, ``src_lang``, ``tgt_lang``,
    ``force``. Prints the checkpoint path on stdout.

    Returns:
        The checkpoint written.
    """
    if not cfg.get("model_dir"):
        raise ConfigError("no model directory given: pass model_dir=<transformers directory>")
    if not cfg.get("out"):
        raise ConfigError("no output given: pass out=<path of the .ckpt to write>")
    out = Path(str(cfg.out))
    if out.exists() and not cfg.get("force", False):
        raise ConfigError(f"{out} exists; pass force=true to replace it")
    imported = read_hf_dir(str(cfg.model_dir), cfg.get("src_lang"), cfg.get("tgt_lang"))
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    source = {"model_dir": str(cfg.model_dir), "format": "transformers-marian"}
    save_model_checkpoint(
        out, model, imported.tokenizer, imported.src_lang, imported.tgt_lang,
        extra={"imported_from": source}, languages=imported.languages,
    )  # fmt: skip
    print(out, flush=True)
    return out
