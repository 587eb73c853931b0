"""Attention heatmaps: cross-attention and encoder/decoder self-attention of one sentence.

The maps show what the model computes: every `MultiHeadAttention` records its weights for
one forward pass (`litmt.models.mha.recording_weights`), in which its kernel returns the
weights (B, H, Tq, Tk) it applies (`forward_with_weights`): a band for `local`, the block layout for `sparse`,
the normalised φ(q)φ(k)ᵀ for `linear`, softmax attention for `math`. Fused exact kernels
(`sdpa`, `flash`, ...) compute softmax attention without exposing it, so `math` stands in
for them under the same mask. The decoder is teacher-forced with the model's own greedy
translation (or a given target).

Axis labels are subword pieces. Decoder positions are labelled by the token each one
*predicts* (y1 ... yn, ``</s>``) on the query axis, and by the token it *reads* (``<s>``,
y1 ... yn) on the key axis of decoder self-attention.

Shapes: H heads, S source pieces, T target positions (n + 1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from litmt.data.tokenization.tokenizer import BOS_ID, Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.greedy import greedy_search
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.models.mha import recording_weights

_D = DecodeConfig()  # the project's decoding defaults

log = logging.getLogger(__name__)

KINDS = {"cross": "cross", "encoder": "encoder_self", "decoder": "decoder_self"}


@dataclass
class AttentionMaps:
    """Attention weights of one sentence pair, per layer.

    Attributes:
        src_pieces: S source subwords.
        tgt_in_pieces: T decoder inputs (``<s>`` y1 ... yn).
        tgt_out_pieces: T decoder outputs (y1 ... yn ``</s>``).
        translation: the detokenised target used for forced decoding.
        weights: {"cross": [(H, T, S)] * layers, "encoder": [(H, S, S)] * layers,
            "decoder": [(H, T, T)] * layers}, float32 on CPU.
    """

    src_pieces: list[str]
    tgt_in_pieces: list[str]
    tgt_out_pieces: list[str]
    translation: str
    weights: dict[str, list[Tensor]]

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query/row labels, key/column labels) for `kind`."""
        if kind == "cross":
            return self.tgt_out_pieces, self.src_pieces
        if kind == "encoder":
            return self.src_pieces, self.src_pieces
        return self.tgt_out_pieces, self.tgt_in_pieces


@torch.no_grad()
def collect_attention(
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    sentence: str,
    *,
    target: str | None = None,
    prefix: Sequence[int] = (),
    max_len_a: float = _D.max_len_a,
    max_len_b: int = _D.max_len_b,
) -> AttentionMaps:
    """Run one sentence through the model, recording every attention map.

    Args:
        model: the model (any attention backend; it is not modified).
        tokenizer: its tokenizer.
        sentence: source text.
        target: target text to force-decode; None = the model's greedy translation.
        prefix: target ids the output starts with (a multilingual model's target-side
            language token, ``data.tag_placement=target``): greedy decoding is forced
            through them, and a forced `target` follows them. They are target positions of
            the maps (their pieces label them); the translation text is decoded as the
            `Translator` decodes it.
        max_len_a, max_len_b: greedy output budget (default: `DecodeConfig`'s).
    """
    cfg = model.config
    device = next(model.parameters()).device
    src_ids = tokenizer.encode_src([sentence])[0][: cfg.max_positions]
    if not src_ids:
        raise ConfigError("the sentence to visualise is empty")
    src = torch.tensor([src_ids], device=device)  # (1, S)
    was_training = model.training
    model.eval()
    if target is None:
        prefixes = [list(prefix)] if prefix else None
        tgt_ids = greedy_search(
            model, src, max_len_a=max_len_a, max_len_b=max_len_b, prefixes=prefixes
        )[0].tokens
    else:
        tgt_ids = [*prefix, *tokenizer.encode_tgt([target])[0]][: cfg.max_positions - 1]
    tgt_in = torch.tensor([[BOS_ID, *tgt_ids]], device=device)  # (1, T)
    modules = model.attention_modules()
    try:
        with recording_weights(modules):
            model(src, tgt_in)
            weights: dict[str, list[Tensor]] = {kind: [] for kind in KINDS}
            site_to_kind = {site: kind for kind, site in KINDS.items()}
            for m in modules:  # model order: encoder layers, then decoder layers (self, cross)
                assert m.last_weights is not None
                weights[site_to_kind[m.site]].append(m.last_weights[0].float().cpu())  # (H, Tq, Tk)
    finally:
        model.train(was_training)
    return AttentionMaps(
        src_pieces=tokenizer.src_pieces(src_ids),
        tgt_in_pieces=["<s>", *tokenizer.tgt_pieces(tgt_ids)],
        tgt_out_pieces=[*tokenizer.tgt_pieces(tgt_ids), "</s>"],
        translation=tokenizer.decode_tgt([tgt_ids])[0],
        weights=weights,
    )


def _select(values: Sequence[int] | None, n: int, what: str, default: list[int]) -> list[int]:
    chosen = list(default if values is None else values)
    if not chosen:
        raise ConfigError(f"no {what} selected")
    for v in chosen:
        if not -n <= int(v) < n:
            raise ConfigError(
                f"{what[:-1]} {v} does not exist: the model has {n} {what} (0-{n - 1})"
            )
    return [int(v) % n for v in chosen]


def plot_attention(
    maps: AttentionMaps,
    kind: str = "cross",
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    grid: bool = False,
    figsize: tuple[float, float] | None = None,
    dpi: int = 100,
    cmap: str = "viridis",
) -> Figure:
    """Heatmap(s) of one kind of attention.

    Args:
        maps: from `collect_attention`.
        kind: "cross", "encoder" (self) or "decoder" (self).
        layers: layer indices (negative counts from the end); None = the last layer.
        heads: head indices; None = all heads.
        grid: one panel per (layer, head) — rows layers, columns heads. Otherwise one panel
            with the weights averaged over the selected layers and heads.
        figsize: (width, height) in inches; None = sized from the number of tokens. The PNG
            is ``figsize * dpi`` pixels.
        dpi: dots per inch of the figure (and of saved PNGs).
        cmap: matplotlib colormap.

    Returns:
        A matplotlib `Figure` (no pyplot state; save with ``fig.savefig(path)``).
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown attention kind '{kind}'; valid kinds: {', '.join(KINDS)}")
    per_layer = maps.weights[kind]
    n_layers, n_heads = len(per_layer), per_layer[0].size(0)
    layer_ids = _select(layers, n_layers, "layers", [n_layers - 1])
    head_ids = _select(heads, n_heads, "heads", list(range(n_heads)))
    rows, cols = maps.labels(kind)
    panels: list[tuple[str, np.ndarray]] = []
    if grid:
        for li in layer_ids:
            for hi in head_ids:
                panels.append((f"layer {li} head {hi}", per_layer[li][hi].numpy()))
        n_rows, n_cols = len(layer_ids), len(head_ids)
    else:
        stack = torch.stack([per_layer[li][head_ids] for li in layer_ids])  # (L, h, Tq, Tk)
        heads_txt = "all heads" if len(head_ids) == n_heads else f"heads {head_ids}"
        layers_txt = f"layer {layer_ids[0]}" if len(layer_ids) == 1 else f"layers {layer_ids}"
        panels.append((f"{layers_txt}, {heads_txt} (mean)", stack.mean(dim=(0, 1)).numpy()))
        n_rows = n_cols = 1
    if figsize is None:
        cell = 0.28  # inches per token
        w = max(3.0, 1.2 + cell * len(cols)) * n_cols
        h = max(2.5, 1.2 + cell * len(rows)) * n_rows
        figsize = (w, h)
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    title = {"cross": "cross-attention", "encoder": "encoder self-attention"}.get(
        kind, "decoder self-attention"
    )
    fig.suptitle(f"{title}: {maps.translation}", fontsize=9)
    small = grid and len(panels) > 1
    for ax, (name, matrix) in zip(axes.flat, panels, strict=True):
        image = ax.imshow(matrix, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(name, fontsize=7 if small else 9)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=5 if small else 7)
        ax.set_yticks(range(len(rows)), rows, fontsize=5 if small else 7)
        if not small:
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.set_layout_engine("tight")
    return fig


def attention_figure(
    model: Seq2SeqTransformer,
    tokenizer: Tokenizer,
    sentence: str,
    kind: str = "cross",
    *,
    target: str | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    grid: bool = False,
    figsize: tuple[float, float] | None = None,
    dpi: int = 100,
) -> Figure:
    """`collect_attention` + `plot_attention` in one call (e.g. to log to W&B each validation)."""
    maps = collect_attention(model, tokenizer, sentence, target=target)
    return plot_attention(
        maps, kind, layers=layers, heads=heads, grid=grid, figsize=figsize, dpi=dpi
    )


def cross_attention_figure(
    model: Seq2SeqTransformer, tokenizer: Tokenizer, sentence: str, **options: Any
) -> Figure:
    """`attention_figure` of the cross-attention (last layer, mean over heads by default)."""
    return attention_figure(model, tokenizer, sentence, "cross", **options)
