"""KVCache: appends equal torch.cat, reorders follow rows, buffers grow and are reused."""

from __future__ import annotations

import torch

from litmt.data.tokenizer import PAD_ID
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.models.cache import KVCache, moved_rows


def test_appends_equal_concatenation_across_growth():
    cache, ref = KVCache(), None
    for t in range(40):  # crosses the initial capacity (16) and a doubling (32)
        k = torch.randn(3, 1 if t else 2, 2, 4)  # (B, Tq, H, D); a 2-token prefix first
        got_k, got_v = cache.append(k, -k)
        ref = k if ref is None else torch.cat([ref, k], dim=1)
        assert torch.equal(got_k, ref) and torch.equal(got_v, -ref)
    assert cache.length == 41


def test_reorder_follows_rows_in_place_without_a_second_buffer():
    cache = KVCache()
    ref = torch.randn(4, 5, 2, 3)
    cache.append(ref, ref)
    pointers = []
    for index in (
        torch.tensor([1, 1, 0, 3]),  # full reorder (3 of 4 rows change)
        torch.tensor([3, 2, 1, 0]),
        torch.tensor([0, 0, 0, 2]),
        torch.tensor([0, 1, 1, 3]),  # one row changes: copied alone (moved_rows)
    ):
        cache.reorder(index, moved_rows(index, 4))
        ref = ref.index_select(0, index)
        assert torch.equal(cache.k, ref) and torch.equal(cache.v, ref)
        pointers.append(cache.k.data_ptr())
    assert len(set(pointers)) == 1  # always the same buffer: nothing allocated per step


def test_moved_rows_only_below_half_and_on_cpu():
    assert moved_rows(torch.tensor([0, 1, 1, 3]), 4)[0].tolist() == [2]
    assert moved_rows(torch.tensor([0, 1, 2, 3]), 4)[0].numel() == 0
    assert moved_rows(torch.tensor([1, 0, 0, 3]), 4) is None  # 3 of 4 move: full reorder
    assert moved_rows(torch.tensor([0, 1]), 4) is None  # the batch shrinks


def test_capacity_reserves_the_whole_search_up_front():
    cache = KVCache(capacity=40)
    for t in range(40):
        x = torch.full((2, 1, 1, 2), float(t))
        cache.append(x, x)
        if t == 0:
            first = cache.k.data_ptr()
    assert cache.k.data_ptr() == first and cache._k.size(1) == 40  # never regrown
    torch.testing.assert_close(cache.k[0, :, 0, 0], torch.arange(40.0))


def test_reorder_can_shrink_the_batch_and_appending_continues():
    cache = KVCache()
    ref = torch.randn(5, 3, 2, 3)
    cache.append(ref, ref)
    cache.reorder(torch.tensor([4, 0]))
    new = torch.randn(2, 1, 2, 3)
    k, _ = cache.append(new, new)
    torch.testing.assert_close(k, torch.cat([ref[[4, 0]], new], dim=1))


def test_beam_like_reorders_past_the_capacity_match_a_full_decode():
    cfg = TransformerConfig(
        src_vocab_size=50,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    model = Seq2SeqTransformer(cfg).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 50, (3, 7), generator=g)
    src[1, 4:] = PAD_ID
    tgt = torch.randint(4, 50, (3, 24), generator=g)  # more steps than the first capacity
    with torch.no_grad():
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        for t in range(tgt.size(1)):
            got = model.decode_step(tgt[:, t], state)
            if t % 5 == 4:  # rows swap places, as beams do
                perm = torch.randperm(3, generator=g)
                state.reorder(perm)
                tgt, memory, mask = tgt[perm], memory[perm], mask[perm]
        ref = model.decode(tgt, memory, mask)[:, -1]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_grouped_cross_attention_equals_copying_the_source_per_beam():
    """init_state(group=K) (one memory row per sentence) == memory repeated K times."""
    cfg = TransformerConfig(
        src_vocab_size=50,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    model = Seq2SeqTransformer(cfg).eval()
    g = torch.Generator().manual_seed(0)
    b, k = 3, 4
    src = torch.randint(4, 50, (b, 7), generator=g)
    src[1, 3:] = PAD_ID
    with torch.no_grad():
        memory, mask = model.encode(src)
        rows = torch.arange(b).repeat_interleave(k)  # (B*K,)
        grouped = model.init_state(memory, mask, group=k)
        expanded = model.init_state(memory[rows], mask[rows])
        tokens = torch.randint(4, 50, (b * k,), generator=g)
        n = b  # sentences still decoding
        for t in range(6):
            a, e = model.decode_step(tokens, grouped), model.decode_step(tokens, expanded)
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
            # beams move within their sentence
            within = torch.arange(n)[:, None] * k + torch.randint(0, k, (n, k), generator=g)
            grouped.reorder(within.view(-1), cross=False)
            expanded.reorder(within.view(-1), cross=False)
            if t == 3:  # drop sentence 1, keep whole sentences 2 and 0
                keep = torch.cat([torch.arange(2 * k, 3 * k), torch.arange(k)])
                grouped.reorder(keep, cross=True)
                expanded.reorder(keep, cross=True)
                n = 2
            tokens = torch.randint(4, 50, (n * k,), generator=g)
        assert grouped.memory.size(0) == 2 and expanded.memory.size(0) == 2 * k
