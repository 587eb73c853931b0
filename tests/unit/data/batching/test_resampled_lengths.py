"""`ResampledPairs` (temperature sampling across directions): the lengths the batch sampler
reads, chunk by chunk, are the base pairs' lengths at the sampled positions."""

from __future__ import annotations

import numpy as np
import pytest

from litmt.data.batching.collate import TokenizedPairs
from litmt.data.corpora.multi import ResampledPairs


def _base(stored: bool, max_len: int | None) -> TokenizedPairs:
    rng = np.random.default_rng(0)
    src = [list(range(int(n))) for n in rng.integers(1, 12, size=50)]
    tgt = [list(range(int(n))) for n in rng.integers(1, 12, size=50)]
    pairs = TokenizedPairs.from_lists(src, tgt, max_src_len=max_len, max_tgt_len=max_len)
    if stored:  # the prepared cache stores the counts (src.len / tgt.len)
        pairs._src_lens = np.diff(pairs.src_offsets).astype(np.int32)
        pairs._tgt_lens = np.diff(pairs.tgt_offsets).astype(np.int32)
    return pairs


@pytest.mark.parametrize("stored", [True, False])
@pytest.mark.parametrize("max_len", [None, 6])
def test_chunked_lengths_equal_the_items_at_the_sampled_positions(stored, max_len):
    base = _base(stored, max_len)
    positions = np.random.default_rng(1).integers(0, len(base), size=120)  # repeats
    pairs = ResampledPairs(base, lambda epoch: positions)
    for a, b in [(0, 120), (0, 7), (7, 64), (64, None)]:
        src, tgt = pairs.src_lengths(a, b), pairs.tgt_lengths(a, b)
        items = [pairs[p] for p in range(a, len(pairs) if b is None else b)]
        assert src.tolist() == [len(s) for _, s, _ in items]
        assert tgt.tolist() == [len(t) + 1 for _, _, t in items]  # + bos/eos
    assert pairs.indices.tolist() == base.indices[positions].tolist()
