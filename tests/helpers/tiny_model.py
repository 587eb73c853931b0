"""The tiny model config the model, decoding and search tests share."""

from __future__ import annotations

from typing import Any

from litmt.models import TransformerConfig


def tiny_config(**overrides: Any) -> TransformerConfig:
    """A 32-wide, 4-head, 2+2-layer model without dropout; `overrides` replace any field."""
    fields: dict[str, Any] = dict(
        src_vocab_size=60,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    return TransformerConfig(**{**fields, **overrides})
