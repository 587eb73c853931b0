"""Pure-torch model code: config, positional encodings, attention module, layers, model."""

from litmt.models.config import (
    ATTENTION_SITES,
    POSITIONAL_ENCODINGS,
    AttentionConfig,
    TransformerConfig,
)
from litmt.models.mha import MultiHeadAttention
from litmt.models.transformer import DecoderState, Seq2SeqTransformer

__all__ = [
    "ATTENTION_SITES",
    "POSITIONAL_ENCODINGS",
    "AttentionConfig",
    "DecoderState",
    "MultiHeadAttention",
    "Seq2SeqTransformer",
    "TransformerConfig",
]
