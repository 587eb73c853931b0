"""Model core: backend parity, KV-cache decoding, padding invariance, config validation."""

from __future__ import annotations

import pytest
import torch
from tiny_model import tiny_config

from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

tiny = tiny_config


def batch(b=3, s=9, t=7, vocab=60):
    src = torch.randint(4, vocab, (b, s))
    src[1, 5:] = PAD_ID
    src[2, 2:] = PAD_ID
    tgt = torch.randint(4, vocab, (b, t))
    return src, tgt


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_math_and_sdpa_give_the_same_logits(positional, norm_first):
    model = Seq2SeqTransformer(tiny(positional=positional, norm_first=norm_first)).eval()
    src, tgt = batch()
    model.set_attention_backend("math")
    a = model(src, tgt)
    model.set_attention_backend("sdpa")
    b = model(src, tgt)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_incremental_decoding_matches_full_decode(positional, backend):
    model = Seq2SeqTransformer(tiny(positional=positional, activation="swiglu")).eval()
    model.set_attention_backend(backend)
    src, tgt = batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        full = model.decode(tgt, memory, mask)  # (B, T, V)
        state = model.init_state(memory, mask)
        steps = torch.stack([model.decode_step(tgt[:, i], state) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_follows_rows():
    model = Seq2SeqTransformer(tiny()).eval()
    src, tgt = batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        for i in range(3):
            model.decode_step(tgt[:, i], state)
        perm = torch.tensor([2, 0, 1])
        state.reorder(perm)
        got = model.decode_step(tgt[perm, 3], state)
        ref = model.decode(tgt[perm, :4], memory[perm], mask[perm])[:, -1]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_appending_source_padding_does_not_change_logits(positional):
    model = Seq2SeqTransformer(tiny(positional=positional)).eval()
    src, tgt = batch()
    padded = torch.cat([src, torch.full((src.size(0), 6), PAD_ID)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_a_checkpoint_from_one_backend_loads_into_another():
    a = Seq2SeqTransformer(tiny()).eval()
    cfg = tiny()
    cfg.attention.encoder_self = cfg.attention.decoder_self = cfg.attention.cross = "math"
    b = Seq2SeqTransformer(cfg).eval()
    b.load_state_dict(a.state_dict())
    src, tgt = batch()
    torch.testing.assert_close(a(src, tgt), b(src, tgt), atol=1e-5, rtol=1e-5)


def test_tied_and_untied_embeddings():
    m = Seq2SeqTransformer(tiny())
    assert m.output_proj.weight is m.tgt_embed.weight is m.src_embed.weight
    m2 = Seq2SeqTransformer(tiny(tgt_vocab_size=50, share_embeddings=False))
    assert m2.src_embed.weight is not m2.tgt_embed.weight
    assert m2(torch.randint(4, 60, (2, 5)), torch.randint(4, 50, (2, 4))).shape == (2, 4, 50)


def test_config_roundtrips_through_a_plain_dict():
    cfg = tiny(positional="rope")
    cfg.attention.encoder_self_options = {"window": 4}
    again = TransformerConfig.from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(d_model=30, n_heads=4), "not divisible"),
        (
            dict(positional="alibi"),
            "unknown positional encoding 'alibi'; valid names: sinusoidal, sinusoidal_split, learned, rope",
        ),
        (dict(activation="tanh"), "unknown activation 'tanh'"),
        (dict(tgt_vocab_size=50), "share_embeddings=true needs a joint vocabulary"),
        (dict(dropout=1.5), "dropout must be in"),
        (
            dict(attention={"cross": "fast"}),
            "unknown attention backend 'fast' for model.attention.cross; valid names:",
        ),
    ],
)
def test_invalid_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        tiny(**kwargs)


def test_positions_beyond_the_maximum_raise():
    model = Seq2SeqTransformer(tiny(max_positions=8))
    with pytest.raises(ValueError, match="max_positions=8"):
        model(torch.randint(4, 60, (1, 12)), torch.randint(4, 60, (1, 3)))
