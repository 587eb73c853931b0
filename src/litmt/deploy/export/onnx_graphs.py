"""The two traceable graphs of the ONNX export: the encoder and one decoder step with a
self-attention key/value cache (`litmt.deploy.export.onnx` writes them).

They run a `Seq2SeqTransformer`'s own submodules (embeddings, projections, LayerNorms, the
feed-forward blocks, the output projection) in the model's order, with plain softmax
attention written out here instead of the kernels and `DecodeCache` objects of
`litmt.models`, so that the whole step is one traceable function of tensors. The positions
are read from the tables of the model's positional modules (sinusoidal, split sinusoidal,
learned, rotary) at positions counted from the input tensors' data, so the trace stays dynamic in every length.

Shapes: B rows, S source length, P positions decoded so far (past), L decoder layers,
H heads, D head dim, C d_model, V target vocabulary. The caches (the file format the browser
page reads too) are one tensor per decoder layer and kind, (B, H, P, D) each: ``cross_k_0``,
``cross_v_0``, ..., ``self_k_0``, ... (`layer_names`), so a step reads and writes each layer's
keys and values where they are, with no split of stacked inputs and no stack of its outputs.

Four more choices keep the runtime's work and the files small:

- The decoder step only appends: its past comes in the order of its rows, and the one copy
  of the cache a step makes is the new position's ``Concat``. A search that moves rows (a
  beam search's reorder, rows dropped) gathers the past itself, and only at the steps that
  move them (`litmt.deploy.engines.onnx.OnnxStepModel.reorder_past`, the page's
  ``nextPast``), so a step whose rows did not move copies the cache once, not twice (format 5
  gathered at every step inside the graph, by a ``beam_index`` input).
- The output projection is a ``Gemm`` reading the (V, C) weight as stored (``transB``), so a
  tied output projection is the target embedding's own initializer, not a transposed copy
  (`litmt.deploy.export.onnx` then stores the weights both graphs share once).
- Self-attention's fused ``qkv_proj`` runs as three projections (`_qkv`): its weight's three
  row blocks become three initializers, so no ``Split`` copies the projected activations.
- The decoder step's cross-attention keys and values, and ``src_ids``, come once per source
  (N rows), the step's R rows being G = R / N consecutive rows per source (`_attend_sources`):
  a beam search's K beams read their sentence's keys and values once, in one (K, D) x (D, S)
  product per head, instead of K copies of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.onnx.operators import reshape_from_tensor_shape, shape_as_tensor

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
    """RoPE of x (B, H, T, D) at positions `pos` (T,) (rotate-half, as `RotaryEmbedding`)."""
    cos = model.rotary.cos.index_select(0, pos)  # (T, D)
    sin = model.rotary.sin.index_select(0, pos)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None, mha: MultiHeadAttention
) -> Tensor:
    """softmax(q k^T / sqrt(D)) v, no causal mask: q (..., Tq, D), k/v (..., Tk, D), pad
    (broadcast to the scores) True at padding, whose scores become `_MASKED`, or None.

    Returns:
        (..., Tq, D)
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(mha.head_dim)  # (..., Tq, Tk)
    if pad is not None:
        scores = scores.masked_fill(pad, _MASKED)
    return torch.matmul(scores.softmax(dim=-1), v)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, pad: Tensor, merged: Tensor, mha: MultiHeadAttention
) -> Tensor:
    """The encoder's attention: q, k, v (B, H, S, D), pad (B, 1, 1, S), `merged` the shape
    (B, S, H * D) as a tensor.

    Returns:
        (B, S, H * D)
    """
    out = _softmax_attention(q, k, v, pad, mha)  # (B, H, S, D)
    return reshape_from_tensor_shape(out.transpose(1, 2), merged)


def _step_heads(x: Tensor, mha: MultiHeadAttention) -> Tensor:
    """One position's (B, 1, C) -> (B, H, 1, D): with one position the two layouts are the
    same memory, so a single ``Reshape`` to a constant shape (no ``Transpose``, and no
    ``Shape``/``Slice``/``Concat`` to build a traced shape)."""
    return x.reshape(-1, mha.n_heads, 1, mha.head_dim)


def _attend_step(q: Tensor, k: Tensor, v: Tensor, mha: MultiHeadAttention) -> Tensor:
    """One decoder query over its past (no mask): q (B, H, 1, D), k/v (B, H, P, D).

    Returns:
        (B, 1, H * D), by a constant-shape ``Reshape`` (`_step_heads`)
    """
    out = _softmax_attention(q, k, v, None, mha)  # (B, H, 1, D)
    return out.reshape(-1, 1, mha.n_heads * mha.head_dim)


def _attend_sources(
    q: Tensor, k: Tensor, v: Tensor, pad: Tensor, grouped: Tensor, mha: MultiHeadAttention
) -> Tensor:
    """Cross-attention of R rows over the keys and values of N sources, the rows of each
    source consecutive and as many for every source (G = R / N: a beam search's beams, 1 for
    greedy or a source per row), so each source's keys and values are stored and read once
    for all its rows: q (R, 1, H * D) as (N, H, G, D) against k/v (N, H, S, D).

    Each row's scores are its own query's dot products with its source's keys, as in
    `_attend`; only the batching differs (one (G, D) x (D, S) product per source and head).

    Args:
        pad: (N, 1, 1, S) True at padding.
        grouped: the shape (N, G, H, D) as a tensor (`torch.onnx.operators`), built once
            for every layer.

    Returns:
        (R, 1, H * D)
    """
    q = reshape_from_tensor_shape(q, grouped).transpose(1, 2)  # (N, H, G, D); r = n * G + g
    out = _softmax_attention(q, k, v, pad, mha)  # (N, H, G, D)
    return out.transpose(1, 2).reshape(-1, 1, mha.n_heads * mha.head_dim)


def _heads(x: Tensor, split: Tensor) -> Tensor:
    """(B, S, C) -> (B, H, S, D), `split` the shape (B, S, H, D) as a tensor."""
    return reshape_from_tensor_shape(x, split).transpose(1, 2)


def _project(x: Tensor, linear: nn.Linear, part: int, parts: int) -> Tensor:
    """Block `part` of `parts` of `linear`'s output features, as its own projection of x
    (B, T, C_in) -> (B, T, C_out / parts): the weight's row block is sliced at trace time, and
    constant folding stores it as its own initializer."""
    size = linear.out_features // parts
    rows = slice(part * size, (part + 1) * size)
    bias = None if linear.bias is None else linear.bias[rows]
    return F.linear(x, linear.weight[rows], bias)


def _qkv(
    model: Seq2SeqTransformer,
    mha: MultiHeadAttention,
    x: Tensor,
    pos: Tensor,
    heads: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor, Tensor]:
    """Self-attention's q, k, v (B, H, T, D) of x (B, T, C) at positions `pos` (T,), rotated
    for rotary models: the fused ``qkv_proj`` as three projections, each split into heads by
    `heads` ((B, T, C) -> (B, H, T, D): `_heads` in the encoder, `_step_heads` in the step)."""
    q, k, v = (heads(_project(x, mha.qkv_proj, i, 3)) for i in range(3))
    if mha.rotary:
        q, k = _rotate(model, q, pos), _rotate(model, k, pos)
    return q, k, v


def layer_names(kind: str, layers: int) -> list[str]:
    """The per-layer tensor names of one cache kind: ``kind_0`` ... ``kind_{layers-1}``."""
    return [f"{kind}_{i}" for i in range(layers)]


def _residual(norm_first: bool, norm: nn.Module, x: Tensor, block: nn.Module) -> Tensor:
    """A residual around `block` with LayerNorm `norm`: pre-norm x + block(norm(x)), or
    post-norm norm(x + block(x)) (as `litmt.models.layers`)."""
    return x + block(norm(x)) if norm_first else norm(x + block(x))


class EncoderGraph(nn.Module):
    """``src_ids`` (B, S) -> ``cross_k_0`` ... ``cross_k_{L-1}``, then ``cross_v_0`` ...
    (B, H, S, D) each: the encoder, then every decoder layer's cross-attention keys and values
    of its output."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        cfg = model.config
        # the (H, D) and (H * D,) tails of the shapes that split and merge the heads
        self.register_buffer("heads", torch.tensor([cfg.n_heads, cfg.head_dim]))
        self.register_buffer("width", torch.tensor([cfg.n_heads * cfg.head_dim]))

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        # built once for every layer: the padding mask (B, 1, 1, S), and the
        # shapes (B, S, H, D) and (B, S, H * D) that split and merge the heads
        pad = src_ids.eq(m.pad_id)[:, None, None, :]
        split = torch.cat([shape_as_tensor(src_ids), self.heads])
        merged = torch.cat([shape_as_tensor(src_ids), self.width])
        # positions 0..S-1 computed from the data (no Python ints: the trace stays dynamic)
        pos = torch.ones_like(src_ids[0]).cumsum(0) - 1  # (S,)
        x = _embed(m, src_ids, m.src_embed, "src_pos", pos)
        for layer in m.encoder_layers:
            mha = layer.self_attn
            h = layer.norm1(x) if layer.norm_first else x
            q, k, v = _qkv(m, mha, h, pos, partial(_heads, split=split))
            h = mha.out_proj(_attend(q, k, v, pad, merged, mha))
            x = x + h if layer.norm_first else layer.norm1(x + h)
            x = _residual(layer.norm_first, layer.norm2, x, layer.ffn)
        memory = m.encoder_norm(x)  # (B, S, C)
        keys, values = [], []
        for layer in m.decoder_layers:
            kv = layer.cross_attn.kv_proj
            keys.append(_heads(_project(memory, kv, 0, 2), split))  # (B, H, S, D)
            values.append(_heads(_project(memory, kv, 1, 2), split))
        return (*keys, *values)


class DecoderStepGraph(nn.Module):
    """One decoder step: ``tokens`` (B,), ``src_ids`` (N, S), then per layer ``cross_k_i``
    ..., ``cross_v_i`` ... (N, H, S, D) and ``self_k_i`` ..., ``self_v_i`` ... (B, H, P, D),
    row b's past in row b -> ``logits`` (B, V), then ``new_self_k_i`` ..., ``new_self_v_i``
    ... (B, H, P + 1, D). The new token sits at position P; rows n * G ... n * G + G - 1
    (G = B / N) read source n."""

    def __init__(self, model: Seq2SeqTransformer) -> None:
        super().__init__()
        self.model = model
        cfg = model.config
        # (-1, H, D): the (G, H, D) tail of the shape that groups a step's rows by source
        self.register_buffer("rows_heads", torch.tensor([-1, cfg.n_heads, cfg.head_dim]))

    def forward(self, tokens: Tensor, src_ids: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        n = len(m.decoder_layers)
        cross_k, cross_v = caches[:n], caches[n : 2 * n]
        self_k, self_v = caches[2 * n : 3 * n], caches[3 * n :]
        # computed once for every layer: the padding mask (N, 1, 1, S), and
        # the shape (N, G, H, D) that groups the rows by source
        pad = src_ids.eq(m.pad_id)[:, None, None, :]
        grouped = torch.cat([shape_as_tensor(src_ids)[:1], self.rows_heads])
        # the new token's position P, counted from the cache's data (the trace stays dynamic)
        pos = torch.ones_like(self_k[0][0, 0, :, 0], dtype=torch.long).sum(0, keepdim=True)
        x = _embed(m, tokens.view(-1, 1), m.tgt_embed, "tgt_pos", pos)  # (B, 1, C)
        new_k, new_v = [], []
        for i, layer in enumerate(m.decoder_layers):
            h = layer.norm1(x) if layer.norm_first else x
            mha = layer.self_attn
            q, k, v = _qkv(m, mha, h, pos, partial(_step_heads, mha=mha))  # (B, H, 1, D)
            k = torch.cat([self_k[i], k], dim=2)  # the new position: (B, H, P + 1, D)
            v = torch.cat([self_v[i], v], dim=2)
            new_k.append(k)
            new_v.append(v)
            h = mha.out_proj(_attend_step(q, k, v, mha))
            x = x + h if layer.norm_first else layer.norm1(x + h)
            h = layer.norm2(x) if layer.norm_first else x
            cross = layer.cross_attn
            q = cross.q_proj(h)  # (B, 1, C)
            h = _attend_sources(q, cross_k[i], cross_v[i], pad, grouped, cross)
            h = cross.out_proj(h)
            x = x + h if layer.norm_first else layer.norm2(x + h)
            x = _residual(layer.norm_first, layer.norm3, x, layer.ffn)
        return (self.project(m.decoder_norm(x)[:, 0]), *new_k, *new_v)

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


__all__ = ["DecoderStepGraph", "EncoderGraph", "layer_names"]
