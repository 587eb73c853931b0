"""The two traceable graphs of the ONNX export: the encoder and one decoder step with a
self-attention key/value cache (`litmt.deploy.export.onnx` writes them).

They run a `Seq2SeqTransformer`'s own submodules (embeddings, projections, LayerNorms, the
feed-forward blocks, the output projection) in the model's order, with plain softmax
attention written out here instead of the kernels and `DecodeCache` objects of
`litmt.models`, so that the whole step is one traceable function of tensors. The positions
are read from the tables of the model's positional modules (sinusoidal, split sinusoidal,
learned, rotary) at positions counted from the input tensors' data, so the trace stays dynamic in every length.

Shapes: B rows, S source length, P positions decoded so far (past), L decoder layers,
H heads, D head dim, C d_model, V target vocabulary. The cache layout (the file format the
browser page reads too) is stacked per layer: (L, B, H, P, D).

Two choices keep the runtime's work and the files small:

- The decoder step takes ``beam_index`` (B,): the rows of the previous step's cache each row
  continues (a beam search's reorder, or rows dropped), gathered inside the graph, so a
  caller hands the previous step's ``new_self_k``/``new_self_v`` back as they came out
  (onnxruntime's IOBinding in python, the same tensors in the page) instead of reordering
  them itself.
- The output projection is a ``Gemm`` reading the (V, C) weight as stored (``transB``), so a
  tied output projection is the target embedding's own initializer, not a transposed copy
  (`litmt.deploy.export.onnx` then stores the weights both graphs share once).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litmt.models import Seq2SeqTransformer
from litmt.models.mha import MultiHeadAttention

# A masked attention logit: finite, so an all-padding row stays finite; exp() of it is 0.
_MASKED = -1e9


def _positions(model: Seq2SeqTransformer, learned: str, pos: Tensor) -> Tensor:
    """Absolute position encodings (T, C) of positions `pos` (T,), or a zero scalar for
    rotary models (positions enter attention instead)."""
    if model.pos_encoding is not None:
        table = model.pos_encoding.table  # (T_max, C)
    elif hasattr(model, learned):
        table = getattr(model, learned).embedding.weight  # (T_max, C)
    else:
        return torch.zeros((), dtype=torch.float32)
    return table.index_select(0, pos)


def _embed(
    model: Seq2SeqTransformer, ids: Tensor, table: nn.Embedding, learned: str, pos: Tensor
) -> Tensor:
    """Token embeddings (B, T, C) of `ids` (B, T), scaled, plus the encodings of `pos` (T,)."""
    return table(ids) * model.embed_scale + _positions(model, learned, pos)


def _rotate(model: Seq2SeqTransformer, x: Tensor, pos: Tensor) -> Tensor:
    """RoPE of x (B, T, H, D) at positions `pos` (T,) (rotate-half, as `RotaryEmbedding`)."""
    cos = model.rotary.cos.index_select(0, pos).unsqueeze(1)  # (T, 1, D)
    sin = model.rotary.sin.index_select(0, pos).unsqueeze(1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _attend(q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None, scale: float) -> Tensor:
    """Softmax attention, no causal mask (the encoder, or one decoder query over its past):
    q (B, H, Tq, D), k/v (B, H, Tk, D), pad (B, Tk) True = padding, scale sqrt(D).

    Returns:
        (B, Tq, H * D)
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) / scale  # (B, H, Tq, Tk)
    if pad is not None:
        scores = scores.masked_fill(pad[:, None, None, :], _MASKED)
    out = torch.matmul(scores.softmax(dim=-1), v)  # (B, H, Tq, D)
    return out.transpose(1, 2).flatten(2)


def _heads(x: Tensor, mha: MultiHeadAttention, parts: int) -> list[Tensor]:
    """(B, T, parts*C) -> `parts` tensors (B, T, H, D)."""
    return list(x.unflatten(-1, (parts, mha.n_heads, mha.head_dim)).unbind(dim=2))


def _qkv(
    model: Seq2SeqTransformer, mha: MultiHeadAttention, x: Tensor, pos: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Self-attention's q, k, v (B, H, T, D) of x (B, T, C) at positions `pos` (T,),
    rotated for rotary models."""
    q, k, v = _heads(mha.qkv_proj(x), mha, 3)  # (B, T, H, D)
    if mha.rotary:
        q, k = _rotate(model, q, pos), _rotate(model, k, pos)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
    return q, k, v


def _residual(norm_first: bool, norm: nn.Module, x: Tensor, block: nn.Module) -> Tensor:
    """A residual around `block` with LayerNorm `norm`: pre-norm x + block(norm(x)), or
    post-norm norm(x + block(x)) (as `litmt.models.layers`)."""
    return x + block(norm(x)) if norm_first else norm(x + block(x))


class EncoderGraph(nn.Module):
    """``src_ids`` (B, S) -> ``cross_k``, ``cross_v`` (L, B, H, S, D): the encoder, then every
    decoder layer's cross-attention keys and values of its output."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        self.scale = math.sqrt(model.config.head_dim)

    def forward(self, src_ids: Tensor) -> tuple[Tensor, Tensor]:
        m = self.model
        pad = src_ids.eq(m.pad_id)  # (B, S)
        # positions 0..S-1 computed from the data (no Python ints: the trace stays dynamic)
        pos = torch.ones_like(src_ids[0]).cumsum(0) - 1  # (S,)
        x = _embed(m, src_ids, m.src_embed, "src_pos", pos)
        for layer in m.encoder_layers:
            h = layer.norm1(x) if layer.norm_first else x
            q, k, v = _qkv(m, layer.self_attn, h, pos)
            h = layer.self_attn.out_proj(_attend(q, k, v, pad, self.scale))
            x = x + h if layer.norm_first else layer.norm1(x + h)
            x = _residual(layer.norm_first, layer.norm2, x, layer.ffn)
        memory = m.encoder_norm(x)  # (B, S, C)
        keys, values = [], []
        for layer in m.decoder_layers:
            k, v = _heads(layer.cross_attn.kv_proj(memory), layer.cross_attn, 2)
            keys.append(k.transpose(1, 2))  # (B, H, S, D)
            values.append(v.transpose(1, 2))
        return torch.stack(keys), torch.stack(values)


class DecoderStepGraph(nn.Module):
    """One decoder step: ``tokens`` (B,), ``src_ids`` (B, S), ``cross_k``/``cross_v``
    (L, B, H, S, D), ``self_k``/``self_v`` (L, B0, H, P, D), ``beam_index`` (B,) rows of
    ``self_k``/``self_v`` -> ``logits`` (B, V), ``new_self_k``/``new_self_v``
    (L, B, H, P + 1, D). The new token sits at position P."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        self.scale = math.sqrt(model.config.head_dim)

    def forward(
        self,
        tokens: Tensor,
        src_ids: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        self_k: Tensor,
        self_v: Tensor,
        beam_index: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        m = self.model
        self_k = self_k.index_select(1, beam_index)  # (L, B, H, P, D)
        self_v = self_v.index_select(1, beam_index)
        pad = src_ids.eq(m.pad_id)  # (B, S)
        # the new token's position P, counted from the cache's data (the trace stays dynamic)
        pos = torch.ones_like(self_k[0, 0, 0, :, 0], dtype=torch.long).sum(0, keepdim=True)
        x = _embed(m, tokens.view(-1, 1), m.tgt_embed, "tgt_pos", pos)  # (B, 1, C)
        new_k, new_v = [], []
        for i, layer in enumerate(m.decoder_layers):
            h = layer.norm1(x) if layer.norm_first else x
            q, k, v = _qkv(m, layer.self_attn, h, pos)  # (B, H, 1, D)
            k, v = torch.cat([self_k[i], k], dim=2), torch.cat([self_v[i], v], dim=2)
            new_k.append(k)
            new_v.append(v)
            h = layer.self_attn.out_proj(_attend(q, k, v, None, self.scale))
            x = x + h if layer.norm_first else layer.norm1(x + h)
            h = layer.norm2(x) if layer.norm_first else x
            cross = layer.cross_attn
            q = cross.q_proj(h).unflatten(-1, (cross.n_heads, cross.head_dim)).transpose(1, 2)
            h = cross.out_proj(_attend(q, cross_k[i], cross_v[i], pad, self.scale))
            x = x + h if layer.norm_first else layer.norm2(x + h)
            x = _residual(layer.norm_first, layer.norm3, x, layer.ffn)
        return self.project(m.decoder_norm(x)[:, 0]), torch.stack(new_k), torch.stack(new_v)

    def project(self, h: Tensor) -> Tensor:
        """`Seq2SeqTransformer.logits` of h (B, C) as one ``Gemm`` (B, V): a 2-D input and a
        bias make the exporter keep the (V, C) weight as stored (``transB=1``)."""
        m = self.model
        weight = m.output_proj.weight  # (V, C): the target embedding when the output is tied
        bias = m.output_proj.bias
        if bias is None:
            bias = torch.zeros(weight.size(0), dtype=weight.dtype)
        if m.config.output_bias:
            bias = bias + m.output_bias.to(weight.dtype)
        return F.linear(h, weight, bias)


__all__ = ["DecoderStepGraph", "EncoderGraph"]
