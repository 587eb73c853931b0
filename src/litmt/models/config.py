"""`TransformerConfig`: the one typed description of a model, validated on construction.

It is stored as a plain dict inside checkpoints (`to_dict` / `from_dict`), so a checkpoint
can be read back without unpickling arbitrary objects.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from litmt.config import check_keys
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

POSITIONAL_ENCODINGS = ("sinusoidal", "sinusoidal_split", "learned", "rope")
ACTIVATIONS = ("relu", "gelu", "silu", "swiglu")
ATTENTION_SITES = ("encoder_self", "decoder_self", "cross")


@dataclass
class AttentionConfig:
    """Which kernel each attention site uses, with per-site options.

    Override one site from the command line with e.g.
    ``model.attention.encoder_self=local model.attention.encoder_self_options.window=64``.
    """

    encoder_self: str = "sdpa"
    """encoder self-attention backend"""
    decoder_self: str = "sdpa"
    """decoder causal self-attention backend"""
    cross: str = "sdpa"
    """decoder→encoder cross-attention backend"""
    encoder_self_options: dict[str, Any] = field(default_factory=dict)
    """options of the encoder self-attention backend (e.g. local's window)"""
    decoder_self_options: dict[str, Any] = field(default_factory=dict)
    """options of the decoder self-attention backend"""
    cross_options: dict[str, Any] = field(default_factory=dict)
    """options of the cross-attention backend"""

    def backend(self, site: str) -> tuple[str, dict[str, Any]]:
        """(name, options) of the kernel at `site` (one of `ATTENTION_SITES`)."""
        return getattr(self, site), dict(getattr(self, f"{site}_options") or {})


@dataclass
class TransformerConfig:
    """Hyper-parameters of a `Seq2SeqTransformer`. Invalid combinations raise `ConfigError`."""

    src_vocab_size: int = 8000
    """source vocabulary (the joint one when shared); filled in from the tokenizer at run time"""
    tgt_vocab_size: int | None = None
    """target vocabulary; filled in from the tokenizer at run time (null = the source's: joint)"""
    d_model: int = 512
    """model width"""
    n_heads: int = 8
    """attention heads (d_model must be divisible by it)"""
    d_ff: int = 2048
    """feed-forward inner width"""
    n_encoder_layers: int = 6
    """encoder layers"""
    n_decoder_layers: int = 6
    """decoder layers"""
    dropout: float = 0.1
    """residual and embedding dropout"""
    attention_dropout: float = 0.0
    """dropout on attention weights"""
    activation_dropout: float = 0.0
    """dropout after the FFN activation"""
    word_dropout: float = 0.0
    """while training, drop whole source tokens with this probability: the embedding is zeroed
    before the positions are added (Sennrich et al. 2016, "Edinburgh NMT systems")"""
    activation: str = "relu"
    """relu | gelu | silu (swish, Marian's) | swiglu"""
    norm_first: bool = True
    """pre-norm (true, stable) or post-norm (false, as in the 2017 paper)"""
    positional: str = "sinusoidal"
    """sinusoidal (sin/cos interleaved) | sinusoidal_split (sin in the first half of the
    channels, cos in the second: Marian's layout) | learned | rope"""
    max_positions: int = 1024
    """longest sequence the model accepts (learned table / sinusoid cache size)"""
    share_embeddings: bool = True
    """tie source and target embeddings (needs a joint vocabulary)"""
    tie_output: bool = True
    """tie the target embedding and the output projection"""
    scale_embeddings: bool = True
    """multiply embeddings by sqrt(d_model)"""
    output_bias: bool = False
    """a fixed (untrained) bias added to the logits (Marian's final_logits_bias)"""
    bias: bool = True
    """biases in linear layers"""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon"""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """the kernel of each attention site (the attention group: conf/attention/)"""

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**_known(AttentionConfig, dict(self.attention)))
        if self.tgt_vocab_size is None:
            self.tgt_vocab_size = self.src_vocab_size
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "n_heads",
            "d_ff",
            "max_positions",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"model.{name} must be at least 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}"
            )
        if self.positional not in POSITIONAL_ENCODINGS:
            raise ConfigError(
                f"unknown positional encoding '{self.positional}'; valid names: "
                f"{', '.join(POSITIONAL_ENCODINGS)}"
            )
        if self.positional == "sinusoidal_split" and self.d_model % 2:
            raise ConfigError("sinusoidal_split needs an even model.d_model")
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ConfigError("rope needs an even head dimension (d_model / n_heads)")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"unknown activation '{self.activation}'; valid names: {', '.join(ACTIVATIONS)}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "word_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                "model.share_embeddings=true needs a joint vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}; set "
                "model.share_embeddings=false or train a joint tokenizer"
            )
        from litmt.attention import list_backends  # local: keep config import-light

        for site in ATTENTION_SITES:
            name, _ = self.attention.backend(site)
            if name not in list_backends():
                raise ConfigError(
                    f"unknown attention backend '{name}' for model.attention.{site}; "
                    f"valid names: {', '.join(list_backends())}"
                )

    @property
    def head_dim(self) -> int:
        """Per-head width D = d_model / n_heads."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        """Plain-types dict (safe to store in a checkpoint)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        """Build from a dict (e.g. a checkpoint's or Hydra's); unknown keys raise `ConfigError`.

        Keys that older versions stored (`LEGACY_KEYS`) are dropped with a log line, so their
        checkpoints still load.
        """
        data = _drop_legacy(dict(data))
        check_keys(data, (f.name for f in fields(cls)), "model config")
        return cls(**data)


# Keys older checkpoints carry that are no longer part of the config. The special token ids
# moved to the tokenizer (`litmt.data.tokenization.tokenizer`); every litmt tokenizer has used these
# values, so a checkpoint whose ids differ cannot be served by this version. `gemm` chose a
# CPU GEMM library that has been removed.
LEGACY_IDS = {"pad_id": 0, "bos_id": 2, "eos_id": 3}
LEGACY_KEYS = (*LEGACY_IDS, "gemm")


def _drop_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without `LEGACY_KEYS`; legacy token ids other than the tokenizer's raise."""
    found = [key for key in LEGACY_KEYS if key in data]
    if not found:
        return data
    for key, expected in LEGACY_IDS.items():
        if key in data and data[key] != expected:
            raise ConfigError(
                f"model config has {key}={data[key]}, but litmt tokenizers use {key}={expected}; "
                "this model cannot be served by this version"
            )
    log.info("model config: ignoring keys of an older version: %s", ", ".join(found))
    return {k: v for k, v in data.items() if k not in LEGACY_KEYS}


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    check_keys(data, (f.name for f in fields(cls)), "model.attention")
    return {
        k: (dict(v) if k.endswith("_options") and v is not None else v) for k, v in data.items()
    }
