"""Word alignments from cross-attention, in Pharaoh format (``0-0 1-2 ...``, source-target).

For a source and its translation, the decoder is teacher-forced once with the translation
while one decoder layer's cross-attention records its weights (`litmt.models.mha
.recording_weights`: the kernel's own `forward_with_weights`, as for the heatmaps). The
weights (H, T, S) are averaged over the chosen heads; target piece j is aligned to the
source piece with the largest weight at the decoder position that *predicts* it (the
hard alignment of fairseq's ``extract_hard_alignment``; the row predicting eos is
dropped). Pieces are then merged to words: a sentencepiece piece starting with "▁" starts
a word (so does a user-defined tag piece such as ``<BT>``), and the pair (source word,
target word) of every aligned piece pair is kept once.

The default layer is the last (fairseq's default for ``--print-alignment``); the
penultimate (``layer=-2``) often aligns better in deeper models (Garg et al. 2019,
"Jointly Learning to Align and Translate with Transformer Models"). An ensemble averages
the members' head-averaged weights.

Shapes: B pairs, H heads, S source pieces, T target positions (pieces + eos).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from litmt.data.tokenization.tokenizer import BOS_ID, PAD_ID
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.models.mha import recording_weights

WORD_START = "\u2581"  # sentencepiece's word-start mark "▁"


@dataclass(frozen=True)
class AlignConfig:
    """Which cross-attention builds the alignments.

    Attributes:
        layer: decoder layer index (negative counts from the end; -1 = the last).
        heads: head indices to average; None = all heads.
    """

    layer: int = -1
    heads: tuple[int, ...] | None = None


def _check(model: Seq2SeqTransformer, config: AlignConfig) -> None:
    n_layers, n_heads = model.config.n_decoder_layers, model.config.n_heads
    if not -n_layers <= config.layer < n_layers:
        raise ConfigError(
            f"alignment layer {config.layer} does not exist: the decoder has {n_layers} layers"
        )
    if config.heads is not None and (
        not config.heads or any(not 0 <= h < n_heads for h in config.heads)
    ):
        raise ConfigError(
            f"alignment heads {list(config.heads)} must be a non-empty list of 0..{n_heads - 1}"
        )


@torch.no_grad()
def cross_attention(
    model: Seq2SeqTransformer, src: Tensor, tgt_in: Tensor, config: AlignConfig
) -> Tensor:
    """Head-averaged cross-attention (B, T, S) of decoder layer ``config.layer``.

    Args:
        src: (B, S) source ids, right-padded.
        tgt_in: (B, T) bos + target ids, right-padded.
    """
    _check(model, config)
    attn = model.decoder_layers[config.layer].cross_attn
    with recording_weights([attn]):
        model(src, tgt_in)
        weights = attn.last_weights  # (B, H, T, S)
    assert weights is not None
    if config.heads is not None:
        weights = weights[:, list(config.heads)]
    return weights.float().mean(dim=1)  # (B, T, S)


def word_index(pieces: Sequence[str], tags: Sequence[str] = ()) -> list[int]:
    """Word number of each piece: a new word starts at "▁", at a tag, and after a tag."""
    out, word = [], -1
    for k, piece in enumerate(pieces):
        after_tag = k > 0 and pieces[k - 1] in tags
        if k == 0 or piece.startswith(WORD_START) or piece in tags or after_tag:
            word += 1
        out.append(max(word, 0))
    return out


def hard_alignment(
    weights: Tensor, src_words: Sequence[int], tgt_words: Sequence[int]
) -> list[tuple[int, int]]:
    """Word pairs (source, target), sorted, from one pair's weights (T, S).

    Rows beyond ``len(tgt_words)`` (eos, padding) and columns beyond ``len(src_words)``
    (padding) are ignored.
    """
    n, s = len(tgt_words), len(src_words)
    if n == 0 or s == 0:
        return []
    best = weights[:n, :s].argmax(dim=-1).tolist()  # (n,) source piece per target piece
    return sorted({(src_words[i], tgt_words[j]) for j, i in enumerate(best)})


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``"i-j i-j ..."``."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


@torch.no_grad()
def align_ids(
    models: Sequence[Seq2SeqTransformer],
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    src_pieces: Sequence[Sequence[str]],
    tgt_pieces: Sequence[Sequence[str]],
    config: AlignConfig | None = None,
    *,
    tags: Sequence[str] = (),
) -> list[list[tuple[int, int]]]:
    """Word alignments of id pairs, one batch (pairs as given; the caller batches).

    Args:
        models: one model or an ensemble's members (weights averaged over them).
        sources, targets: ids without bos/eos; pieces: their subword strings.
        tags: source pieces that are words of their own (user-defined tags).

    Returns:
        Per pair, the sorted (source word, target word) pairs.
    """
    config = config or AlignConfig()
    if not sources:
        return []
    device = next(models[0].parameters()).device
    src = torch.full((len(sources), max(1, *map(len, sources))), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((len(targets), 1 + max(0, *map(len, targets))), PAD_ID, dtype=torch.long)
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[row, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        tgt_in[row, : 1 + len(t)] = torch.as_tensor([BOS_ID, *t], dtype=torch.long)
    src, tgt_in = src.to(device), tgt_in.to(device)  # (B, S), (B, T)
    weights = sum(cross_attention(m, src, tgt_in, config) for m in models) / len(models)
    assert isinstance(weights, Tensor)
    out = []
    for row in range(len(sources)):
        src_words = word_index(src_pieces[row], tags)
        tgt_words = word_index(tgt_pieces[row])
        out.append(hard_alignment(weights[row].cpu(), src_words, tgt_words))
    return out


__all__ = ["AlignConfig", "align_ids", "cross_attention", "hard_alignment", "pharaoh", "word_index"]
