"""The peers litmt is timed against, at identical sizes: Hugging Face Marian
(`build_marian`, `marian_generate`), `torch.nn.Transformer` (`TorchTransformerMT`) and litmt
itself (`build_litmt`, `litmt_greedy`, `litmt_beam`), each with its training step
(`make_train_step`) and its decode function (`decode_fn`). `benchmarks.benchmark` is the
harness that times them.

The peers come from the `bench` extra (`pip install -e ".[bench]"`); the library never
imports them. Shapes: B batch, S source length, T target length, C d_model, V vocabulary,
K beam size, N forced decode steps.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.common import (
    Batch,
)
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.models import Seq2SeqTransformer, TransformerConfig


@dataclass(frozen=True)
class Size:
    """Model dimensions shared by all three implementations (FFN = 4·d)."""

    name: str
    d_model: int
    n_heads: int
    layers: int  # encoder layers = decoder layers

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    def label(self) -> str:
        return f"d={self.d_model}, {self.layers}+{self.layers} layers, {self.n_heads} heads"


SIZES = {
    "small": Size("small", 256, 4, 3),
    "base": Size("base", 512, 8, 6),
    "tiny": Size("tiny", 32, 2, 1),  # --smoke only
}


# -- the three models --------------------------------------------------------------------
def build_litmt(size: Size, vocab: int, dropout: float) -> Seq2SeqTransformer:
    cfg = TransformerConfig(
        src_vocab_size=vocab,
        d_model=size.d_model,
        n_heads=size.n_heads,
        d_ff=size.d_ff,
        n_encoder_layers=size.layers,
        n_decoder_layers=size.layers,
        dropout=dropout,
        max_positions=512,
    )
    return Seq2SeqTransformer(cfg)


def build_marian(size: Size, vocab: int, dropout: float) -> nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=vocab,
        d_model=size.d_model,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.n_heads,
        decoder_attention_heads=size.n_heads,
        encoder_ffn_dim=size.d_ff,
        decoder_ffn_dim=size.d_ff,
        activation_function="relu",  # as litmt and nn.Transformer
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=512,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        scale_embedding=True,
    )
    cfg._attn_implementation = "sdpa"  # its fastest exact kernel on CPU (see docs)
    return MarianMTModel(cfg)


class TorchTransformerMT(nn.Module):
    """`nn.Transformer` with tied embeddings, sinusoidal positions and an output projection.

    Dropout matches litmt's defaults: 0.1 on residuals/embeddings, none on attention
    weights or after the FFN activation.
    """

    def __init__(self, size: Size, vocab: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, size.d_model, padding_idx=PAD_ID)
        self.scale = math.sqrt(size.d_model)
        pos = torch.arange(512, dtype=torch.float32)[:, None]
        inv = torch.exp(torch.arange(0, size.d_model, 2) * (-math.log(10000.0) / size.d_model))
        table = torch.zeros(512, size.d_model)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
        self.register_buffer("pos", table, persistent=False)  # (512, C)
        self.drop = nn.Dropout(dropout)
        with warnings.catch_warnings():  # "enable_nested_tensor ... norm_first": eval-only path
            warnings.simplefilter("ignore")
            self.transformer = nn.Transformer(
                size.d_model,
                size.n_heads,
                size.layers,
                size.layers,
                size.d_ff,
                dropout,
                batch_first=True,
                norm_first=True,
            )
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout.p = 0.0  # the FFN activation dropout
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0
        self.out = nn.Linear(size.d_model, vocab, bias=False)
        self.out.weight = self.embed.weight

    def _embed(self, ids: Tensor) -> Tensor:
        return self.drop(self.embed(ids) * self.scale + self.pos[: ids.size(1)])  # (B, L, C)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V)."""
        src_pad = src.eq(PAD_ID)  # (B, S)
        t = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=src.device)
        h = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.out(h)


def logits_fn(name: str, model: nn.Module) -> Callable[[Batch], Tensor]:
    """A function batch -> logits (B, T, V) for the model called `name`."""
    if name == "marian":

        def run(b: Batch) -> Tensor:
            mask = b.src.ne(PAD_ID).long()
            return model(input_ids=b.src, attention_mask=mask, decoder_input_ids=b.tgt_in).logits

        return run
    return lambda b: model(b.src, b.tgt_in)


BUILDERS: dict[str, Callable[[Size, int, float], nn.Module]] = {
    "litmt": build_litmt,
    "marian": build_marian,
    "nn.Transformer": TorchTransformerMT,
}


# -- training ---------------------------------------------------------------------------
def label_smoothed_loss(logits: Tensor, target: Tensor) -> Tensor:
    """The same loss for all: mean label-smoothed (0.1) CE over non-pad target tokens."""
    return F.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=PAD_ID, label_smoothing=0.1
    )


def make_train_step(
    name: str, model: nn.Module, compile_model: bool = False
) -> Callable[[Batch], Tensor]:
    """One optimiser step on a batch; returns the loss (no host sync inside)."""
    if compile_model:
        model.compile(dynamic=True)  # in place, so the state-dict keys stay the same
    forward = logits_fn(name, model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)

    def step(b: Batch) -> Tensor:
        loss = label_smoothed_loss(forward(b), b.tgt_out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


# -- decoding ---------------------------------------------------------------------------
@torch.inference_mode()
def litmt_greedy(model: Seq2SeqTransformer, src: Tensor, steps: int) -> Tensor:
    """`litmt.decoding.search.dispatch.decode`, greedy, held to exactly `steps` tokens (min = max length): (B, N).

    It runs one decoder step more than `steps`: the one that emits the forced eos.
    """
    config = DecodeConfig(method="greedy", max_len_a=0.0, max_len_b=steps, min_len=steps)
    return torch.tensor([h[0].tokens for h in decode(model, src, config)])


@torch.inference_mode()
def litmt_beam(model: Seq2SeqTransformer, src: Tensor, beam: int, steps: int) -> Tensor:
    """`litmt.decoding.search.dispatch.decode`, beam search, held to exactly `steps` tokens: (B, N), best ones.

    The library's search as users run it: KV cache, beams sharing their sentence's encoder
    output and cross-attention K/V, first step on one row per sentence, two-pass top-k,
    finished-hypothesis bookkeeping and the per-step stop test. Like greedy, one decoder
    step more than `steps` (the forced eos).
    """
    config = DecodeConfig(beam_size=beam, max_len_a=0.0, max_len_b=steps, min_len=steps)
    return torch.tensor([h[0].tokens for h in decode(model, src, config)])


@torch.inference_mode()
def marian_generate(model: nn.Module, src: Tensor, beam: int, steps: int) -> Tensor:
    out = model.generate(
        input_ids=src,
        attention_mask=src.ne(PAD_ID).long(),
        num_beams=beam,
        do_sample=False,
        min_new_tokens=steps,
        max_new_tokens=steps,
        length_penalty=1.0,
        early_stopping=False,
        use_cache=True,
    )
    return out[:, 1:]  # drop decoder_start


def decode_fn(name: str, model: nn.Module, beam: int, steps: int) -> Callable[[Tensor], Tensor]:
    if name.startswith("litmt"):
        if beam == 1:
            return lambda src: litmt_greedy(model, src, steps)
        return lambda src: litmt_beam(model, src, beam, steps)
    return lambda src: marian_generate(model, src, beam, steps)


# -- memory -----------------------------------------------------------------------------
