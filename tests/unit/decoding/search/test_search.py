"""Greedy and beam search against naive full-recomputation references on tiny random models."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_model import tiny_config

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.beam import beam_search, topk_rows
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.greedy import greedy_search
from litmt.decoding.search.rules import length_penalty_factor, output_budgets
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

VOCAB = 40


def tiny_model(seed: int = 0, eos_boost: float = 2.5, **kw) -> Seq2SeqTransformer:
    """A random model whose eos is likely enough that hypotheses end at varied lengths."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(tiny_config(**{"src_vocab_size": VOCAB, **kw})).eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID] *= eos_boost  # tied output: raises eos logits
    return model


def sources(n: int = 6, s: int = 9, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (n, s), generator=g)
    for i in range(n):
        src[i, s - i :] = PAD_ID  # varied lengths, row 0 unpadded
    return src


@torch.no_grad()
def full_logprobs(model, src_row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """log P(. | prefix) by a full forward pass (no cache): (V,)."""
    tgt = torch.tensor([[BOS_ID, *prefix]])
    logits = model(src_row[None], tgt)[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)


def naive_greedy(model, src_row, budget: int, min_len: int = 0) -> list[int]:
    out: list[int] = []
    for step in range(budget + 1):
        logp = full_logprobs(model, src_row, out)
        if step < min_len:
            logp[EOS_ID] = -math.inf
        tok = EOS_ID if step == budget else int(logp.argmax())
        if tok == EOS_ID:
            return out
        out.append(tok)
    raise AssertionError("unreachable")


def naive_beam(model, src_row, budget: int, k: int, alpha: float, n_best: int, min_len: int = 0):
    """Per-sentence beam search with full recomputation and plain Python bookkeeping."""
    live = [(0.0, [])]  # (log-prob, tokens)
    finished: list[tuple[float, float, list[int]]] = []  # (score, log-prob, tokens)
    for step in range(budget + 1):
        cands = []
        for lp, toks in live:
            logp = full_logprobs(model, src_row, toks)
            if step < min_len:
                logp[EOS_ID] = -math.inf
            if step == budget:
                cands.append((lp + float(logp[EOS_ID]), toks, EOS_ID))
                continue
            for tok in range(logp.numel()):
                cands.append((lp + float(logp[tok]), toks, tok))
        cands.sort(key=lambda c: -c[0])
        cands = cands[: 2 * k]
        for total, toks, tok in cands[:k]:
            if tok == EOS_ID:
                finished.append((total / ((5 + step + 1) / 6) ** alpha, total, toks))
        finished.sort(key=lambda f: -f[0])
        finished = finished[:k]
        live = [(total, [*toks, tok]) for total, toks, tok in cands if tok != EOS_ID][:k]
        if len(finished) >= k or step == budget or not live:
            break
        best = max(lp for lp, _ in live)
        reach = best / ((5 + budget + 1) / 6) ** alpha if alpha > 0 else best
        if len(finished) >= n_best and finished[n_best - 1][0] >= reach:
            break
    return finished[:n_best]


def budgets(model, src, a=1.2, b=10):
    return output_budgets(src.ne(PAD_ID).sum(1), a, b, model.config.max_positions).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model = tiny_model(seed)
    src = sources(8, seed=seed + 10)
    greedy = greedy_search(model, src)
    beam = beam_search(model, src, beam_size=1)
    lengths = {len(h.tokens) for h in greedy}
    assert len(lengths) > 1, "test model should stop at varied lengths"
    for g, (b,) in zip(greedy, beam, strict=True):
        assert b.tokens == g.tokens
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-4)
        assert b.score == pytest.approx(g.score, abs=1e-4)
    assert decode(model, src, DecodeConfig(beam_size=1)) == [[h] for h in greedy]


def test_greedy_drops_finished_rows_without_changing_outputs(monkeypatch):
    """Greedy search drops finished rows from the state once DROP_FINISHED_SHARE of the live
    rows are done: the steps run on fewer rows, and every output, log-probability and score
    (with prefixes, min_len and budgets indexed by sentence) is the one without the drop."""
    import litmt.decoding.search.greedy as greedy

    model = tiny_model(4)
    src = sources(8, seed=12).flip(0)  # the longest last: the live rows are not a prefix
    options = dict(max_len_a=1.0, max_len_b=6, min_len=2, prefixes=[[5], [], [7, 8]] + [[]] * 5)
    rows: list[int] = []
    step = model.decode_step

    def counting(tokens, state):
        rows.append(tokens.numel())
        return step(tokens, state)

    monkeypatch.setattr(model, "decode_step", counting)
    dropped = greedy_search(model, src, **options)
    assert rows[0] == 8 and min(rows) < 8  # rows were dropped on the way
    assert rows == sorted(rows, reverse=True)
    rows.clear()
    monkeypatch.setattr(greedy, "DROP_FINISHED_SHARE", 2.0)  # never
    kept = greedy_search(model, src, **options)
    assert set(rows) == {8}
    assert len({len(h.tokens) for h in kept}) > 1, "outputs should end at varied lengths"
    for a, b in zip(dropped, kept, strict=True):
        assert a.tokens == b.tokens
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-5)
        assert a.score == pytest.approx(b.score, abs=1e-5)
    assert kept[0].tokens[:1] == [5] and kept[2].tokens[:2] == [7, 8]


# Decoder self-attention kernels with their own decode state: local keeps a window of 2
# keys (shorter than the outputs), linear keeps running sums; sdpa keeps every K/V.
DECODER_SELF = {
    "sdpa": {},
    "local": {"decoder_self": "local", "decoder_self_options": {"window": 2}},
    "linear": {"decoder_self": "linear"},
}


@pytest.mark.parametrize("decoder_self", sorted(DECODER_SELF))
@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
def test_cached_greedy_equals_full_recomputation(positional, decoder_self):
    model = tiny_model(3, positional=positional, attention=DECODER_SELF[decoder_self])
    src = sources(5)
    hyps = greedy_search(model, src, max_len_a=1.0, max_len_b=4)
    for i, budget in enumerate(budgets(model, src, 1.0, 4)):
        row = src[i][src[i] != PAD_ID]
        assert hyps[i].tokens == naive_greedy(model, row, budget)


@pytest.mark.parametrize("decoder_self", sorted(DECODER_SELF))
@pytest.mark.parametrize(("k", "alpha", "n_best"), [(3, 1.0, 3), (4, 0.0, 2), (2, 0.6, 1)])
def test_cached_beam_equals_naive_full_recomputation(k, alpha, n_best, decoder_self):
    model = tiny_model(4, attention=DECODER_SELF[decoder_self])
    src = sources(4)
    got = beam_search(model, src, beam_size=k, length_penalty=alpha, n_best=n_best, max_len_b=3)
    for i, budget in enumerate(budgets(model, src, 1.2, 3)):
        row = src[i][src[i] != PAD_ID]
        ref = naive_beam(model, row, budget, k, alpha, n_best)
        assert [h.tokens for h in got[i]] == [toks for _, _, toks in ref]
        for h, (score, logp, _) in zip(got[i], ref, strict=True):
            assert h.score == pytest.approx(score, abs=1e-4)
            assert h.log_prob == pytest.approx(logp, abs=1e-4)


def test_nbest_lists_are_sorted_and_scores_are_consistent():
    model = tiny_model(5)
    src = sources(6)
    alpha = 0.8
    nbest = beam_search(model, src, beam_size=5, n_best=5, length_penalty=alpha)
    for hyps in nbest:
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5  # distinct hypotheses
        for h in hyps:
            lp = length_penalty_factor(len(h.tokens) + 1, alpha)
            assert h.score == pytest.approx(h.log_prob / lp, rel=1e-5)
            assert EOS_ID not in h.tokens and PAD_ID not in h.tokens


def test_beam_scores_match_the_model_probability_of_the_hypothesis():
    model = tiny_model(6)
    src = sources(3)
    for i, hyps in enumerate(beam_search(model, src, beam_size=3, n_best=3)):
        row = src[i][src[i] != PAD_ID]
        for h in hyps:
            logp = sum(
                float(full_logprobs(model, row, h.tokens[:j])[tok])
                for j, tok in enumerate([*h.tokens, EOS_ID])
            )
            assert h.log_prob == pytest.approx(logp, abs=1e-4)


def test_beam_search_is_batch_independent():
    model = tiny_model(7)
    src = sources(6)
    batched = beam_search(model, src, beam_size=4, n_best=2)
    for i in range(src.size(0)):
        row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        alone = beam_search(model, row, beam_size=4, n_best=2)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]


def test_max_length_is_a_times_src_len_plus_b_clamped():
    model = tiny_model(9, eos_boost=0.0)  # eos never wins: every hypothesis hits the budget
    src = sources(4)
    src_len = src.ne(PAD_ID).sum(1).tolist()
    for hyp, n in zip(greedy_search(model, src, max_len_a=0.5, max_len_b=2), src_len, strict=True):
        assert len(hyp.tokens) == math.floor(0.5 * n + 2)
    for hyps, n in zip(
        beam_search(model, src, beam_size=3, max_len_a=1.0, max_len_b=1), src_len, strict=True
    ):
        assert len(hyps[0].tokens) == n + 1
    long = beam_search(model, src[:1], beam_size=2, max_len_a=10.0, max_len_b=100)
    assert len(long[0][0].tokens) == model.config.max_positions - 1


@pytest.mark.parametrize("n", [100, 1000, 4000, 4001, 40000])
@pytest.mark.parametrize("k", [1, 5, 10])
def test_topk_rows_matches_torch_topk(n, k):
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(7, n, generator=g)
    x[1] = torch.randint(0, 3, (n,), generator=g).float()  # many ties
    x[2, : n // 2] = -math.inf  # -inf in part of a row
    x[3] = -math.inf  # a dead row (beam search's unreachable candidates)
    values, idx = topk_rows(x, k)
    ref_values, _ = x.topk(k, dim=-1)
    assert torch.equal(values, ref_values)  # the same values, sorted
    assert torch.equal(x.gather(1, idx), values)  # the indices point at them
    for row in idx.tolist():
        assert len(set(row)) == k  # distinct positions


def test_min_len_suppresses_eos_like_the_naive_search():
    model = tiny_model(3, eos_boost=20.0)  # eos is very likely: hypotheses would be short
    src = sources(4)
    budget = budgets(model, src)
    short = greedy_search(model, src)
    assert min(len(h.tokens) for h in short) < 3
    for i, hyp in enumerate(greedy_search(model, src, min_len=3)):
        assert len(hyp.tokens) >= 3
        assert hyp.tokens == naive_greedy(model, src[i], budget[i], min_len=3)
    for i, hyps in enumerate(beam_search(model, src, beam_size=3, n_best=2, min_len=3)):
        ref = naive_beam(model, src[i], budget[i], 3, 1.0, 2, min_len=3)
        assert [h.tokens for h in hyps] == [r[2] for r in ref]
        assert all(len(h.tokens) >= 3 for h in hyps)
    forced = beam_search(model, src, beam_size=2, max_len_a=0.0, max_len_b=5, min_len=5)
    assert all(len(h[0].tokens) == 5 for h in forced)  # a fixed length: min = max
    over = greedy_search(model, src, max_len_a=0.0, max_len_b=2, min_len=9)
    assert all(len(h.tokens) == 2 for h in over)  # the budget wins over min_len


def test_large_vocabulary_beam_search_matches_the_naive_search():
    """K·V large enough for the chunked top-k, with the first step on one row per sentence."""
    vocab = 700
    model = tiny_model(5, eos_boost=3.0, src_vocab_size=vocab, n_encoder_layers=1, max_positions=32)
    src = torch.randint(4, vocab, (3, 5))
    src[2, 3:] = PAD_ID
    budget = output_budgets(src.ne(PAD_ID).sum(1), 1.0, 2, 32).tolist()
    got = beam_search(model, src, beam_size=4, max_len_a=1.0, max_len_b=2, n_best=2)
    for i, hyps in enumerate(got):
        ref = naive_beam(model, src[i], budget[i], 4, 1.0, 2)
        assert [h.tokens for h in hyps] == [r[2] for r in ref]
        for h, r in zip(hyps, ref, strict=True):
            assert h.score == pytest.approx(r[0], abs=1e-4)


def test_bad_search_options_raise_config_errors():
    model = tiny_model(0)
    src = sources(2)
    with pytest.raises(ConfigError, match="n_best must be between 1 and beam_size=2"):
        beam_search(model, src, beam_size=2, n_best=3)
    with pytest.raises(ConfigError, match="beam_size must be at least 1"):
        beam_search(model, src, beam_size=0)
    with pytest.raises(ConfigError, match="exceeds the model's max_positions=64"):
        greedy_search(model, torch.randint(4, VOCAB, (1, 70)))
    with pytest.raises(ConfigError, match="min_len must be >= 0, got -1"):
        beam_search(model, src, beam_size=2, min_len=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_search_on_cuda_matches_cpu():
    model = tiny_model(10)
    src = sources(6)
    cpu_beam = beam_search(model, src, beam_size=4, n_best=2)
    cpu_greedy = greedy_search(model, src)
    model.cuda()
    gpu_beam = beam_search(model, src.cuda(), beam_size=4, n_best=2)
    gpu_greedy = greedy_search(model, src.cuda())
    assert [[h.tokens for h in b] for b in gpu_beam] == [[h.tokens for h in b] for b in cpu_beam]
    assert [h.tokens for h in gpu_greedy] == [h.tokens for h in cpu_greedy]
