"""Layer weight names of litmt and of transformers' Marian / Pegasus, one table both ways.

Both transformers classes name a layer's weights alike (``self_attn.q_proj``,
``self_attn_layer_norm``, ``encoder_attn``, ``fc1``, ``final_layer_norm``); litmt fuses q/k/v
(``qkv_proj`` rows [q; k; v]) and cross-attention k/v (``kv_proj`` rows [k; v]), so one litmt
weight is the row-wise concatenation of one to three transformers weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from litmt.models import TransformerConfig

# litmt name in a layer -> transformers names in that layer, concatenated along rows
ENCODER_LAYER = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.out_proj": ("self_attn.out_proj",),
    "norm1": ("self_attn_layer_norm",),
    "ffn.fc1": ("fc1",),
    "ffn.fc2": ("fc2",),
    "norm2": ("final_layer_norm",),
}
DECODER_LAYER = {
    **ENCODER_LAYER,
    "cross_attn.q_proj": ("encoder_attn.q_proj",),
    "cross_attn.kv_proj": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
    "cross_attn.out_proj": ("encoder_attn.out_proj",),
    "norm2": ("encoder_attn_layer_norm",),
    "norm3": ("final_layer_norm",),
}
FINAL_NORMS = {"encoder_norm": "encoder.layer_norm", "decoder_norm": "decoder.layer_norm"}
LITMT_DIR = "litmt"  # in a format=hf export: litmt's tokenizer and model config, for re-import


def channel_order(config: TransformerConfig) -> Tensor:
    """(C,) litmt channel of each transformers channel: transformers' sinusoids put sin in
    channels [0, C/2) and cos in [C/2, C); litmt's ``sinusoidal`` interleaves them, so its
    even channels go first. Identity for ``sinusoidal_split``."""
    c = config.d_model
    if config.positional == "sinusoidal":
        return torch.cat([torch.arange(0, c, 2), torch.arange(1, c, 2)])
    return torch.arange(c)


def permute_channels(name: str, w: Tensor, order: Tensor) -> Tensor:
    """Transformers weight `name` with its residual-stream dimension reordered by `order`
    (`channel_order` to export; its inverse, ``argsort``, to import). LayerNorm and attention
    do not depend on the channel order, so the model computes the same function."""
    if w.dim() == 1:  # biases of outputs on the residual stream, LayerNorms
        on_stream = ("out_proj", "fc2", "layer_norm")
        return w[order] if any(k in name for k in on_stream) else w
    if name.endswith(("out_proj.weight", "fc2.weight")):  # (C, in): rows on the stream
        return w[order]
    return w[:, order]  # (out, C): q/k/v, fc1, embeddings, lm_head read the stream


def _pairs(config: TransformerConfig) -> Iterable[tuple[str, tuple[str, ...]]]:
    """(litmt prefix, transformers prefixes) of every mapped module (pre-norm: final norms)."""
    for side, n, table in (
        ("encoder", config.n_encoder_layers, ENCODER_LAYER),
        ("decoder", config.n_decoder_layers, DECODER_LAYER),
    ):
        for i in range(n):
            for ours, theirs in table.items():
                yield f"{side}_layers.{i}.{ours}", tuple(f"{side}.layers.{i}.{t}" for t in theirs)
    if config.norm_first:
        for ours, theirs in FINAL_NORMS.items():
            yield ours, (theirs,)


def hf_layer_weights(hf: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """litmt's layer (and final-norm) weights from transformers' (``model.`` prefix removed).

    Raises:
        KeyError: a transformers weight is missing (its name).
    """
    out = {}
    for ours, theirs in _pairs(config):
        for kind in ("weight", "bias"):
            out[f"{ours}.{kind}"] = torch.cat([hf[f"{t}.{kind}"] for t in theirs], dim=0)
    return out


def to_hf_layer_weights(sd: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """transformers' layer (and final-norm) weights from litmt's (no ``model.`` prefix).

    A missing litmt bias (``bias=false``) becomes zeros: transformers' layers always have one.
    """
    out = {}
    for ours, theirs in _pairs(config):
        for kind in ("weight", "bias"):
            w = sd.get(f"{ours}.{kind}")
            if w is None:
                w = torch.zeros(sd[f"{ours}.weight"].size(0))
            for name, part in zip(theirs, w.chunk(len(theirs), dim=0), strict=True):
                out[f"{name}.{kind}"] = part.contiguous()
    return out
