"""Decode caches: the default KVCache, local's window and linear's running sums.

Every cache must make incremental decoding equal the full causal pass, also when beam
search reorders, fans out or drops rows between steps.
"""

from __future__ import annotations

import pytest
import torch
from tiny_model import tiny_config

from litmt.attention import build_backend
from litmt.attention.backends.linear import LinearState
from litmt.attention.backends.local import WindowCache
from litmt.attention.cache import KVCache
from litmt.data.tokenization.tokenizer import PAD_ID
from litmt.models import Seq2SeqTransformer

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

# Decoder self-attention backends (name, options); the window (3) and the sparse blocks
# (4 tokens) are shorter than the decoded targets, so they matter.
DECODER_SELF = {
    "sdpa": ("sdpa", {}),
    "math": ("math", {}),
    "local": ("local", {"window": 3}),
    "linear": ("linear", {"chunk_size": 4}),
    "sparse": ("sparse", {"block_size": 4, "stride": 2}),
}


def tiny_model(decoder_self: str = "sdpa", positional: str = "sinusoidal") -> Seq2SeqTransformer:
    name, options = DECODER_SELF[decoder_self]
    attention = {"decoder_self": name, "decoder_self_options": options}
    torch.manual_seed(0)
    return Seq2SeqTransformer(tiny_config(positional=positional, attention=attention)).eval()


def test_appends_equal_concatenation_across_growth():
    cache, ref = KVCache(build_backend("sdpa")), None
    for t in range(40):  # crosses the initial capacity (16) and a doubling (32)
        k = torch.randn(3, 1 if t else 2, 2, 4)  # (B, Tq, H, D); a 2-token prefix first
        got_k, got_v = cache.append(k, -k)
        ref = k if ref is None else torch.cat([ref, k], dim=1)
        assert torch.equal(got_k, ref) and torch.equal(got_v, -ref)
    assert cache.length == 41


def test_capacity_reserves_the_whole_search_up_front():
    cache = KVCache(build_backend("sdpa"), capacity=40)
    pointers = set()
    for t in range(40):
        x = torch.full((2, 1, 1, 2), float(t))
        k, _ = cache.append(x, x)
        pointers.add(k.data_ptr())
    assert len(pointers) == 1  # never regrown
    torch.testing.assert_close(k[0, :, 0, 0], torch.arange(40.0))


def test_reorder_can_shrink_the_batch_and_appending_continues():
    cache = KVCache(build_backend("sdpa"))
    ref = torch.randn(5, 3, 2, 3)
    cache.append(ref, ref)
    cache.reorder(torch.tensor([4, 0]))
    new = torch.randn(2, 1, 2, 3)
    k, _ = cache.append(new, new)
    torch.testing.assert_close(k, torch.cat([ref[[4, 0]], new], dim=1))


@pytest.mark.parametrize(
    ("decoder_self", "cache_type"),
    [("sdpa", KVCache), ("sparse", KVCache), ("local", WindowCache), ("linear", LinearState)],
)
def test_each_kernel_makes_its_own_cache(decoder_self, cache_type):
    model = tiny_model(decoder_self)
    state = model.init_state(torch.zeros(1, 2, 32), None, capacity=8)
    assert all(type(layer.self_attn) is cache_type for layer in state.layers)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
@pytest.mark.parametrize("decoder_self", sorted(DECODER_SELF))
def test_every_step_equals_the_full_pass_through_beam_like_reorders(decoder_self, positional):
    model = tiny_model(decoder_self, positional)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 50, (3, 7), generator=g)
    src[1, 4:] = PAD_ID
    tgt = torch.randint(4, 50, (3, 20), generator=g)  # longer than the first KV capacity
    with torch.no_grad():
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        steps = []
        for t in range(tgt.size(1)):
            steps.append(model.decode_step(tgt[:, t], state))  # (B, V)
            if t % 5 == 4:  # rows swap places, as beams do
                perm = torch.randperm(3, generator=g)
                state.reorder(perm)
                tgt, memory, mask = tgt[perm], memory[perm], mask[perm]
                steps = [s[perm] for s in steps]
        full = model.decode(tgt, memory, mask)  # (B, T, V)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decoder_self", ["sdpa", "local", "linear"])
def test_fan_out_and_dropping_rows_equal_decoding_each_sentence_alone(decoder_self):
    """What beam search does: one row per sentence, then K rows each, then fewer sentences."""
    model = tiny_model(decoder_self)
    g = torch.Generator().manual_seed(1)
    b, k = 3, 4
    src = torch.randint(4, 50, (b, 7), generator=g)
    src[1, 3:] = PAD_ID
    tgt = torch.randint(4, 50, (b, k, 9), generator=g)  # the tokens each beam is fed
    tgt[:, :, 0] = tgt[:, :1, 0]  # the first step is shared by a sentence's beams
    with torch.no_grad():
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        model.decode_step(tgt[:, 0, 0], state)
        state.reorder(torch.arange(b).repeat_interleave(k), cross=True)  # fan out: (B*K,)
        alive = torch.arange(b)
        for t in range(1, tgt.size(2)):
            got = model.decode_step(tgt[alive, :, t].reshape(-1), state)  # (b*K, V)
            if t == 4:  # sentence 1 finishes: keep the beams of sentences 2 and 0
                alive = torch.tensor([2, 0])
                rows = (alive[:, None] * k + torch.arange(k)).view(-1)
                state.reorder(rows, cross=True)
        # Reference: each surviving beam decoded alone, without a cache.
        ref_src = src[alive].repeat_interleave(k, dim=0)  # (b*K, S)
        ref = model(ref_src, tgt[alive].reshape(-1, tgt.size(2)))[:, -1]  # (b*K, V)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_local_cache_keeps_only_the_window():
    model = tiny_model("local")  # window 3
    state = model.init_state(torch.randn(2, 5, 32), None)
    with torch.no_grad():
        for t in range(30):
            model.decode_step(torch.full((2,), 5 + t), state)
            for layer in state.layers:
                assert layer.self_attn.k.shape == (2, min(t + 1, 3), 4, 8)  # (B, kept, H, D)


def test_linear_cache_is_the_same_size_at_every_step():
    model = tiny_model("linear")
    state = model.init_state(torch.randn(2, 5, 32), None)
    with torch.no_grad():
        for t in range(30):
            model.decode_step(torch.full((2,), 5 + t), state)
            for layer in state.layers:
                assert layer.self_attn.s.shape == (2, 4, 8, 8)  # (B, H, D, E)
                assert layer.self_attn.z.shape == (2, 4, 8)  # (B, H, D)
