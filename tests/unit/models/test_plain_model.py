"""`models/` is plain PyTorch: no private ops, honest under weight writes, traceable."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from tiny_model import tiny_config

import litmt.models
from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.models import Seq2SeqTransformer

MODELS_DIR = Path(litmt.models.__file__).parent


def tiny() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(src_vocab_size=30)).eval()  # default settings


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (2, 7), generator=g)
    src[1, 5:] = PAD_ID
    return src, torch.randint(4, 30, (2, 5), generator=g)


def test_models_use_no_private_ops_or_custom_autograd():
    sources = sorted(MODELS_DIR.rglob("*.py"))
    assert len(sources) >= 5
    for path in sources:
        text = path.read_text()
        for pattern in (r"torch\.ops\.", r"autograd\.Function", r"torch\._C\b"):
            assert not re.search(pattern, text), f"{path.name} uses {pattern}"


def test_in_place_weight_writes_change_the_output():
    """EMA and weight surgery write `.data` in place; no stale copy may hide it."""
    model, (src, tgt) = tiny(), batch()
    with torch.no_grad():
        before = model(src, tgt)
        model(src, tgt)  # a second call: any cache of the weights would be warm now
        for layer in model.decoder_layers:
            layer.ffn.fc2.weight.data.mul_(0)
            layer.ffn.fc2.bias.data.mul_(0)
        after = model(src, tgt)
        ref = model.decode(tgt, *model.encode(src))  # the same through another path
    assert (before - after).abs().max() > 1e-3
    torch.testing.assert_close(after, ref)
    with torch.no_grad():
        model.output_proj.weight.data.mul_(0)  # tied with the embeddings: zero logits
        assert model(src, tgt).abs().max() == 0


def test_encoder_can_be_traced():
    model, (src, _) = tiny(), batch()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, src: torch.Tensor) -> torch.Tensor:
            return self.model.encode(src)[0]  # (B, S, C)

    encoder = Encoder().eval()
    with torch.no_grad():
        traced = torch.jit.trace(encoder, src)
        other = src.flip(0)  # another batch of the same shape
        torch.testing.assert_close(traced(other), encoder(other))
