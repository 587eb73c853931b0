"""`Seq2SeqTransformer`: encoder, decoder, and incremental decoding with per-layer caches.

Shapes: B batch, S source length, T target length, C d_model, V target vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from litmt.attention import AttentionRequest
from litmt.models.cache import LayerCache
from litmt.models.config import ATTENTION_SITES, TransformerConfig
from litmt.models.layers import DecoderLayer, EncoderLayer
from litmt.models.mha import MultiHeadAttention
from litmt.models.positional import (
    LearnedPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    SplitSinusoidalPositionalEncoding,
)

# The logit of a token the model must never produce (`output_bias`): finite, so that label
# smoothing stays finite, and far below any real logit, so that its probability is exactly 0.
NEVER_LOGIT = -1e4


@dataclass
class DecoderState:
    """Everything an incremental decode step needs: the encoder output and the caches.

    Attributes:
        memory: encoder output (B, S, C), one row per decoder row.
        src_padding_mask: (B, S) bool, True = pad.
        layers: one `LayerCache` per decoder layer: the self-attention kernel's own
            `DecodeCache` and the cross-attention K/V (projected at the first step).
        step: number of target positions decoded so far.
    """

    memory: Tensor
    src_padding_mask: Tensor | None
    layers: list[LayerCache] = field(default_factory=list)
    step: int = 0

    def reorder(self, index: Tensor, *, cross: bool = True) -> None:
        """Keep decoder rows `index` (B',) in that order, e.g. to follow beams.

        Pass ``cross=False`` when every new row has the same source as the row it comes
        from (the beams of one sentence): the source side (memory, mask, cross K/V) is then
        left as it is. Fanning one row out to K beams, or dropping finished sentences,
        needs ``cross=True``.
        """
        for layer in self.layers:
            layer.self_attn.reorder(index)
        if not cross:
            return
        self.memory = self.memory.index_select(0, index)
        if self.src_padding_mask is not None:
            self.src_padding_mask = self.src_padding_mask.index_select(0, index)
        for layer in self.layers:
            layer.cross.reorder(index)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017) with swappable attention kernels."""

    def __init__(self, config: TransformerConfig, *, pad_id: int = 0) -> None:
        """Build the model.

        Args:
            config: the hyper-parameters.
            pad_id: the tokenizer's padding id (`litmt.data.tokenization.tokenizer.PAD_ID`): its embedding
                row is zero and source positions holding it are masked.
        """
        super().__init__()
        self.config = cfg = config
        self.pad_id = pad_id
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=pad_id)
        if cfg.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=pad_id)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        rotary = None
        self.pos_encoding: nn.Module | None = None
        if cfg.positional == "sinusoidal":
            self.pos_encoding = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions)
        elif cfg.positional == "sinusoidal_split":
            self.pos_encoding = SplitSinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions)
        elif cfg.positional == "learned":
            self.src_pos = LearnedPositionalEncoding(cfg.d_model, cfg.max_positions)
            self.tgt_pos = LearnedPositionalEncoding(cfg.d_model, cfg.max_positions)
        else:
            rotary = RotaryEmbedding(cfg.head_dim, cfg.max_positions)
            self.rotary = rotary
        self.embed_dropout = nn.Dropout(cfg.dropout)
        # applied to a (B, S, 1) mask of ones: drops whole source tokens, scales the rest
        self.word_dropout = nn.Dropout(cfg.word_dropout)
        # (V_src,) bool: source ids word dropout never drops (see `exempt_from_word_dropout`)
        self.register_buffer(
            "word_dropout_exempt",
            torch.zeros(cfg.src_vocab_size, dtype=torch.bool),
            persistent=False,
        )
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(cfg, rotary) for _ in range(cfg.n_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(cfg, rotary) for _ in range(cfg.n_decoder_layers)
        )
        self.encoder_norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        )
        self.decoder_norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        )
        self.output_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.output_bias:  # (V,), fixed: a buffer, like Marian's final_logits_bias
            self.register_buffer("output_bias", torch.zeros(cfg.tgt_vocab_size))
        self.reset_parameters()
        if cfg.tie_output:
            self.output_proj.weight = self.tgt_embed.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform linears, N(0, C^-1/2) embeddings with a zero pad row."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()

    def exempt_from_word_dropout(self, ids: Iterable[int]) -> None:
        """Never drop these source ids (`model.word_dropout`): markers such as eos and the
        language and corpus tags, whose loss would change what the model is asked to do."""
        for i in ids:
            self.word_dropout_exempt[i] = True

    # -- embeddings ---------------------------------------------------------------------
    def _embed(
        self,
        tokens: Tensor,
        table: nn.Embedding,
        learned: str,
        offset: int = 0,
        drop_words: bool = False,
    ) -> Tensor:
        x = table(tokens) * self.embed_scale  # (B, T, C)
        if drop_words and self.training and self.word_dropout.p > 0:
            keep = self.word_dropout(x.new_ones(*tokens.shape, 1))  # (B, T, 1): 0 or 1/(1-p)
            x = x * keep.masked_fill(self.word_dropout_exempt[tokens].unsqueeze(-1), 1.0)
        if self.pos_encoding is not None:
            x = x + self.pos_encoding(tokens.size(1), offset).to(x.dtype)
        elif hasattr(self, learned):
            x = x + getattr(self, learned)(tokens.size(1), offset)
        return self.embed_dropout(x)

    # -- full passes --------------------------------------------------------------------
    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encode source ids.

        Args:
            src: (B, S) token ids, right-padded with `pad_id`.

        Returns:
            memory (B, S, C) and src_padding_mask (B, S) bool (True = pad).
        """
        mask = src.eq(self.pad_id)  # (B, S)
        x = self._embed(src, self.src_embed, "src_pos", drop_words=True)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x), mask

    def decode_hidden(
        self, tgt_in: Tensor, memory: Tensor, src_padding_mask: Tensor | None
    ) -> Tensor:
        """Decoder states before the output projection, (B, T, C), for a full target."""
        x = self._embed(tgt_in, self.tgt_embed, "tgt_pos")
        for layer in self.decoder_layers:
            x = layer(x, memory, src_padding_mask)
        return self.decoder_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_padding_mask: Tensor | None) -> Tensor:
        """Logits (B, T, V) for teacher-forced targets `tgt_in` (B, T) (bos + y, right-padded).

        Right padding needs no target mask: causal attention never lets a real position
        see a later (padded) one.
        """
        return self.logits(self.decode_hidden(tgt_in, memory, src_padding_mask))

    def logits(self, hidden: Tensor) -> Tensor:
        """Output scores (..., V) of decoder states (..., C): the projection (+ `output_bias`)."""
        out = self.output_proj(hidden)
        return out + self.output_bias.to(out.dtype) if self.config.output_bias else out

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V) for source (B, S) and teacher-forced target input (B, T)."""
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)

    # -- incremental decoding -----------------------------------------------------------
    def init_state(
        self,
        memory: Tensor,
        src_padding_mask: Tensor | None,
        capacity: int | None = None,
    ) -> DecoderState:
        """Empty caches for decoding against `memory` (B, S, C), one row per decoder row.

        Each decoder self-attention kernel makes its own cache (`kernel.new_cache`).
        `capacity`: target positions the search decodes at most (its longest output, eos
        included), so a cache can reserve them up front; None: unknown.
        """
        layers = [
            LayerCache(layer.self_attn.kernel.new_cache(capacity)) for layer in self.decoder_layers
        ]
        return DecoderState(memory, src_padding_mask, layers)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one new target token per row and return next-token logits.

        Args:
            tokens: (B,) or (B, 1) ids of the tokens at position `state.step`.
            state: the cache from `init_state` / previous steps (updated in place).

        Returns:
            (B, V) logits for position `state.step + 1`.
        """
        tokens = tokens.view(-1, 1)  # (B, 1)
        x = self._embed(tokens, self.tgt_embed, "tgt_pos", offset=state.step)
        for layer, cache in zip(self.decoder_layers, state.layers, strict=True):
            x = layer(x, state.memory, state.src_padding_mask, cache=cache, offset=state.step)
        state.step += 1
        return self.logits(self.decoder_norm(x))[:, 0]  # (B, V)

    # -- attention backends -------------------------------------------------------------
    def attention_modules(self) -> list[MultiHeadAttention]:
        """Every MultiHeadAttention in the model."""
        return [m for m in self.modules() if isinstance(m, MultiHeadAttention)]

    def set_attention_backend(self, name: str, site: str | None = None, **options: Any) -> None:
        """Use kernel `name` at `site` (one of ATTENTION_SITES) or everywhere (site=None)."""
        for m in self.attention_modules():
            if site is None or m.site == site:
                m.set_backend(name, **options)
        for s in ATTENTION_SITES if site is None else (site,):
            setattr(self.config.attention, s, name)
            setattr(self.config.attention, f"{s}_options", dict(options))

    def validate_backends(
        self,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        *,
        training: bool = True,
    ) -> None:
        """Raise `BackendError` now if any site's kernel cannot serve this model on `device`/`dtype`."""
        for m in self.attention_modules():
            m.validate(
                AttentionRequest(
                    causal=m.site == "decoder_self",
                    padding_mask=m.site != "decoder_self",
                    dropout=training and self.config.attention_dropout > 0,
                    device=device,
                    dtype=dtype,
                    site=m.site,
                )
            )

    def num_parameters(self) -> int:
        """Trainable parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
