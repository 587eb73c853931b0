"""A litmt model as a CTranslate2 model spec: the weight mapping behind the export.

The model is described through CTranslate2's Python spec API
(``ctranslate2.specs.TransformerSpec`` with a ``TransformerEncoderSpec`` and a
``TransformerDecoderSpec``), the way its own converters do it
(``ctranslate2/converters/fairseq.py``: ``set_transformer_encoder`` ...), then validated.
`litmt.deploy.export.ct2_converter` hands the spec to CTranslate2's ``Converter`` (quantisation,
saving) and `litmt.deploy.export.ct2` writes the export directory around it.

What is mapped, and how:

- pre-/post-norm (``pre_norm``; the final encoder/decoder LayerNorm only in pre-norm, as
  litmt); LayerNorm epsilon (``config.layer_norm_epsilon``).
- Positions: CTranslate2's built-in sinusoid (``generate_sinusoidal_position_encoding`` in
  ``src/layers/common.cc``) is *not* litmt's: it concatenates [sin | cos] with timescales
  ``log(10000) / (C/2 - 1)`` and counts positions from 1, while litmt interleaves sin/cos
  with ``log(10000) / (C/2)`` from position 0. So the table is always exported explicitly
  (``position_encodings.encodings``), sinusoidal (either layout) or learned. RoPE maps to CTranslate2's
  rotary self-attention with ``rotary_interleave=False`` (litmt rotates halves).
- Embeddings: shared or separate source/target tables, tied output projection (the
  spec's variable aliasing stores one copy), ``scale_embeddings`` (sqrt(C) or none).
- ``output_bias`` (models imported from Marian): the output projection's bias.
- Activations: relu, gelu (exact erf form, ``Activation.GELU``), silu (``SWISH``), swiglu (``ffn_glu`` with
  ``Activation.SWISH``: ``silu(linear_0(x)) * linear_0_noact(x)``; litmt's fc1 rows hold
  the gate half first).
- Fused projections: litmt's self-attention ``qkv_proj`` rows are [q; k; v] and the
  cross-attention ``kv_proj`` rows [k; v], the fused layouts CTranslate2 expects
  (``utils.fuse_linear`` in the fairseq converter builds the same). Biases are optional.
- Special tokens: litmt's ids pad=0, unk=1, bos=2, eos=3 become CTranslate2's pieces
  ``<blank>``, ``<unk>``, ``<s>``, ``</s>`` at the same ids (the fairseq converter's
  ``<pad>`` -> ``<blank>``); the decoder starts from ``<s>``, no bos/eos on the source
  (a tokenizer with ``src_eos`` ends every source with ``</s>`` itself). A piece vocabulary
  (`litmt.data.tokenization.piece_vocab`) gives the pieces instead of the sentencepiece model.

Refused (`ExportError`, one line): an approximate attention kernel at any site (local,
sparse, linear, flex with a window: ``support.exact`` is false), since CTranslate2 computes
full softmax attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from litmt.attention import backend_support, build_backend
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from litmt.deploy.export.base import ExportError
from litmt.errors import BackendError
from litmt.models import Seq2SeqTransformer, TransformerConfig

# litmt special ids -> the pieces CTranslate2's vocabulary conventions use for them.
CT2_SPECIAL_PIECES = {PAD_ID: "<blank>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def import_ctranslate2() -> Any:
    """The ctranslate2 module, or `ExportError` saying how to install it."""
    try:
        import ctranslate2
    except ImportError as exc:
        raise ExportError(
            "the CTranslate2 engine needs the ctranslate2 package: pip install 'litmt[ct2]'"
        ) from exc
    return ctranslate2


def _is_exact(name: str, options: dict[str, Any]) -> bool:
    """Whether kernel `name` with `options` computes full softmax attention (its `support`)."""
    try:
        return bool(build_backend(name, **options).support.exact)  # options may change it (flex)
    except BackendError:  # cannot be built here (e.g. its package is missing): the declaration
        return bool(backend_support(name).exact)


def check_exportable(config: TransformerConfig) -> None:
    """Raise `ExportError` if CTranslate2 cannot represent this model.

    CTranslate2 computes full softmax attention, so a site whose kernel is approximate
    (``support.exact`` false: local, sparse, linear, flex with a window or layout) is refused.

    Raises:
        ExportError: one line naming the setting and why.
    """
    for site in ("encoder_self", "decoder_self", "cross"):
        name, options = config.attention.backend(site)
        if not _is_exact(name, options):
            raise ExportError(
                f"cannot export: model.attention.{site}={name} is an approximate attention "
                "(CTranslate2 only computes full softmax attention, so its outputs would differ)"
            )


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _linear(spec: Any, module: nn.Linear, rows: slice | None = None) -> None:
    weight = module.weight if rows is None else module.weight[rows]
    spec.weight = _np(weight)
    if module.bias is not None:
        spec.bias = _np(module.bias if rows is None else module.bias[rows])


def _norm(spec: Any, module: nn.LayerNorm) -> None:
    spec.gamma = _np(module.weight)
    spec.beta = _np(module.bias) if module.bias is not None else np.zeros_like(spec.gamma)


def _ffn(spec: Any, ffn: nn.Module, norm: nn.LayerNorm, config: TransformerConfig) -> None:
    _norm(spec.layer_norm, norm)
    if config.activation == "swiglu":  # fc1 rows: [gate (activated); value]
        _linear(spec.linear_0, ffn.fc1, slice(0, config.d_ff))
        _linear(spec.linear_0_noact, ffn.fc1, slice(config.d_ff, 2 * config.d_ff))
    else:
        _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def _self_attention(spec: Any, mha: nn.Module, norm: nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear[0], mha.qkv_proj)  # rows [q; k; v], CTranslate2's fused layout
    _linear(spec.linear[1], mha.out_proj)


def _cross_attention(spec: Any, mha: nn.Module, norm: nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear[0], mha.q_proj)
    _linear(spec.linear[1], mha.kv_proj)  # rows [k; v]
    _linear(spec.linear[2], mha.out_proj)


def _positions(model: Seq2SeqTransformer, side: str) -> np.ndarray | None:
    """The (max_positions, C) table added to the embeddings of `side`, or None (RoPE)."""
    cfg = model.config
    if cfg.positional in ("sinusoidal", "sinusoidal_split"):
        return _np(model.pos_encoding(cfg.max_positions))
    if cfg.positional == "learned":
        return _np(getattr(model, f"{side}_pos")(cfg.max_positions))
    return None


def ct2_vocabulary(tokenizer: Tokenizer, side: str) -> list[str]:
    """The `side` ("src" | "tgt") pieces by id, with CTranslate2's special-token spellings."""
    proc = tokenizer.src if side == "src" else tokenizer.tgt
    specials = (proc.pad_id(), proc.unk_id(), proc.bos_id(), proc.eos_id())
    if tokenizer.vocab is None and specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise ExportError(
            f"cannot export: the {side} tokenizer's pad/unk/bos/eos ids are {specials}, "
            f"litmt's are {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
        )
    size = tokenizer.src_vocab_size if side == "src" else tokenizer.tgt_vocab_size
    pieces = (tokenizer.src_pieces if side == "src" else tokenizer.tgt_pieces)(range(size))
    for i, piece in CT2_SPECIAL_PIECES.items():
        pieces[i] = piece
    if len(set(pieces)) != len(pieces):
        raise ExportError(
            f"cannot export: the {side} vocabulary has a piece spelled like a CTranslate2 "
            f"special token ({', '.join(CT2_SPECIAL_PIECES.values())})"
        )
    return pieces


def build_spec(model: Seq2SeqTransformer, tokenizer: Tokenizer) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding `model`'s weights.

    Raises:
        ExportError: the model cannot be represented (see `check_exportable`).
    """
    ct2 = import_ctranslate2()
    specs = ct2.specs
    cfg = model.config
    check_exportable(cfg)
    activation = {
        "relu": specs.Activation.RELU,
        "gelu": specs.Activation.GELU,  # exact erf GELU, as torch's F.gelu default
        "silu": specs.Activation.SWISH,
        "swiglu": specs.Activation.SWISH,  # silu
    }[cfg.activation]
    rope = cfg.positional == "rope"
    common: dict[str, Any] = dict(
        pre_norm=cfg.norm_first, activation=activation, ffn_glu=cfg.activation == "swiglu"
    )
    if rope:  # all head dims, rotate-half (not interleaved) like litmt's RotaryEmbedding
        common.update(rotary_dim=0, rotary_interleave=False, rotary_base=10000.0)
    encoder = specs.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, **common)
    decoder = specs.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **common)
    spec = specs.TransformerSpec(encoder, decoder)

    for side, part, table in (("src", encoder, model.src_embed), ("tgt", decoder, model.tgt_embed)):
        embeddings = part.embeddings[0] if isinstance(part.embeddings, list) else part.embeddings
        embeddings.weight = _np(table.weight)
        part.scale_embeddings = bool(cfg.scale_embeddings)  # True: sqrt(C), False: none
        positions = _positions(model, side)
        if positions is not None:
            part.position_encodings.encodings = positions
        elif hasattr(part, "position_encodings"):  # the encoder spec always declares one
            del part.position_encodings
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _ffn(layer_spec.ffn, layer.ffn, layer.norm2, cfg)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _cross_attention(layer_spec.attention, layer.cross_attn, layer.norm2)
        _ffn(layer_spec.ffn, layer.ffn, layer.norm3, cfg)
    if cfg.norm_first:
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)
    _linear(decoder.projection, model.output_proj)  # tied: aliased to the embedding on save
    if cfg.output_bias:
        decoder.projection.bias = _np(model.output_bias)

    spec.register_source_vocabulary(ct2_vocabulary(tokenizer, "src"))
    spec.register_target_vocabulary(ct2_vocabulary(tokenizer, "tgt"))
    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token, spec.config.bos_token = "<unk>", "<s>"
    spec.config.eos_token, spec.config.decoder_start_token = "</s>", "<s>"
    spec.config.add_source_bos = spec.config.add_source_eos = False
    try:
        spec.validate()
    except ValueError as exc:  # a weight the spec expects was not set: a bug in this mapping
        raise ExportError(f"cannot export: {str(exc).splitlines()[0]}") from exc
    return spec


__all__ = [
    "CT2_SPECIAL_PIECES",
    "ExportError",
    "build_spec",
    "check_exportable",
    "ct2_vocabulary",
    "import_ctranslate2",
]
