"""Checkpoints of older versions: their model config carried keys that are gone now."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_checkpoint import tiny_checkpoint_path

from litmt.checkpoint.io import META_KEY
from litmt.checkpoint.load import load_model
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.models.config import LEGACY_IDS

OLD_KEYS = {"pad_id": 0, "bos_id": 2, "eos_id": 3, "gemm": "auto"}


def test_legacy_ids_are_the_tokenizers_ids() -> None:
    # The values old checkpoints must carry, and the pad id the model masks by default,
    # are the tokenizer's: if the tokenizer's ids ever change, this fails.
    assert LEGACY_IDS == {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    model = Seq2SeqTransformer(TransformerConfig(src_vocab_size=16, d_model=8, n_heads=2))
    assert model.pad_id == PAD_ID


def test_from_dict_drops_legacy_keys_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    new = TransformerConfig(src_vocab_size=16, d_model=8, n_heads=2).to_dict()
    with caplog.at_level(logging.INFO, logger="litmt.models.config"):
        cfg = TransformerConfig.from_dict({**new, **OLD_KEYS})
    assert cfg.to_dict() == new
    assert "ignoring keys of an older version: pad_id, bos_id, eos_id, gemm" in caplog.text


def test_legacy_id_other_than_the_tokenizers_is_refused() -> None:
    new = TransformerConfig(src_vocab_size=16, d_model=8, n_heads=2).to_dict()
    with pytest.raises(ConfigError, match="eos_id=5, but litmt tokenizers use eos_id=3"):
        TransformerConfig.from_dict({**new, "eos_id": 5})


def test_unknown_keys_still_raise() -> None:
    with pytest.raises(ConfigError, match="unknown model config keys"):
        TransformerConfig.from_dict({"src_vocab_size": 16, "n_layers": 2})


def test_old_checkpoint_loads_and_decodes_the_same(tmp_path_factory, tmp_path) -> None:
    path = tiny_checkpoint_path(tmp_path_factory)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt[META_KEY]["model_config"].update(OLD_KEYS)  # what the old code stored
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID]])
    a, b = load_model(path).model, load_model(old).model
    with torch.no_grad():
        torch.testing.assert_close(a.encode(src)[0], b.encode(src)[0], rtol=0, atol=0)
