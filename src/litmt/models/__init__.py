"""Pure-torch model code: config, positional encodings, attention module, layers, model."""

from litmt.models.attention import MultiHeadAttention
from litmt.models.config import (
    ATTENTION_SITES,
    BOS_ID,
    EOS_ID,
    PAD_ID,
    POSITIONAL_ENCODINGS,
    UNK_ID,
    AttentionConfig,
    TransformerConfig,
)
from litmt.models.linear import GEMM_BACKENDS, Linear, onednn_available
from litmt.models.transformer import DecoderState, Seq2SeqTransformer

__all__ = [
    "ATTENTION_SITES",
    "BOS_ID",
    "EOS_ID",
    "GEMM_BACKENDS",
    "PAD_ID",
    "POSITIONAL_ENCODINGS",
    "UNK_ID",
    "AttentionConfig",
    "DecoderState",
    "Linear",
    "MultiHeadAttention",
    "Seq2SeqTransformer",
    "TransformerConfig",
    "onednn_available",
]
