"""Sampling for back-translation: seeded, temperature, top-k and top-p."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_checkpoint import tiny_checkpoint_path
from tiny_model import tiny_config

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.greedy import filter_logits, greedy_search
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

CONF = Path(__file__).resolve().parents[4] / "conf"
VOCAB = 40


def random_model(seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB)).eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID] *= 2.0  # tied output: hypotheses end at varied lengths
    return model


def sources() -> torch.Tensor:
    return torch.randint(4, VOCAB, (6, 9), generator=torch.Generator().manual_seed(2))


def sample(model, src, **fields):
    return decode(model, src, DecodeConfig(method="sample", **fields))


def tokens(found) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in found]


def test_a_fixed_seed_reproduces_the_samples_and_another_seed_does_not():
    model, src = random_model(), sources()
    first = sample(model, src, n_best=4, seed=11)
    assert tokens(first) == tokens(sample(model, src, n_best=4, seed=11))
    assert tokens(first) != tokens(sample(model, src, n_best=4, seed=12))
    assert all(len(hyps) == 4 for hyps in first)
    assert len({tuple(h.tokens) for hyps in first for h in hyps}) > 6  # samples differ
    for hyps in first:  # best first, with scores consistent with log_prob
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_a_sample_reports_the_models_own_log_probability():
    """log_prob is the model's (temperature 1, no cut), as `litmt.decoding.analysis.forced` would give it."""
    model, src = random_model(), sources()[:2]
    reference = copy.deepcopy(model).double()  # float64 full passes
    found = sample(model, src, n_best=2, seed=0, temperature=1.5, top_k=20)
    for i, hyps in enumerate(found):
        for h in hyps:
            y = torch.tensor([[BOS_ID, *h.tokens, EOS_ID]])
            with torch.no_grad():
                logp = F.log_softmax(reference(src[i : i + 1], y[:, :-1]), dim=-1)
            want = logp[0].gather(1, y[0, 1:, None]).sum().item()
            assert h.log_prob == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("fields", [{"temperature": 0.0}, {"top_k": 1}, {"temperature": 1e-4}])
def test_temperature_zero_and_top_k_one_are_greedy(fields):
    model, src = random_model(), sources()
    greedy = greedy_search(model, src)
    found = sample(model, src, n_best=2, seed=5, **fields)
    for g, hyps in zip(greedy, found, strict=True):
        for h in hyps:
            assert h.tokens == g.tokens
            assert h.log_prob == pytest.approx(g.log_prob, abs=1e-5)


def test_first_tokens_follow_the_tempered_distribution():
    """With a one-token budget the sampler draws once from softmax(logits / T)."""
    model, src = random_model(), sources()[:1]
    with torch.no_grad():
        memory, mask = model.encode(src)
        logits = model.decode_step(torch.tensor([BOS_ID]), model.init_state(memory, mask))[0]
    logits[EOS_ID] = -math.inf  # min_len=1: no eos at the first step
    for temperature in (0.5, 2.0):
        found = sample(
            model, src, n_best=4000, seed=1, temperature=temperature,
            max_len_a=0.0, max_len_b=1, min_len=1,
        )  # fmt: skip
        firsts = torch.tensor([h.tokens[0] for h in found[0]])
        freq = torch.bincount(firsts, minlength=logits.numel()).double() / firsts.numel()
        want = F.softmax(logits.double() / temperature, dim=-1)
        assert (freq - want).abs().max() < 0.03, temperature


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()
    kept = {
        p: torch.isfinite(filter_logits(logits, top_p=p))[0].nonzero()[:, 0].tolist()
        for p in (0.3, 0.5, 0.7, 0.9, 0.97, 1.0)
    }
    assert kept[0.3] == [1]  # the most likely token alone already reaches 0.3
    assert kept[0.5] == [1]  # 0.5 reaches 0.5
    assert kept[0.7] == [1, 3]  # 0.5 + 0.3
    assert kept[0.9] == [1, 2, 3]  # 0.5 + 0.3 + 0.15 = 0.95
    assert kept[0.97] == kept[1.0] == [0, 1, 2, 3]


def test_top_k_keeps_the_k_most_likely():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    assert torch.isfinite(filter_logits(logits, top_k=2))[0].nonzero()[:, 0].tolist() == [1, 3]
    both = filter_logits(logits, top_k=3, top_p=0.6)  # top-3, then the nucleus among them
    assert torch.isfinite(both)[0].nonzero()[:, 0].tolist() == [1]


def test_samples_respect_the_budget_and_min_len():
    model, src = random_model(), sources()
    for hyps in sample(model, src, n_best=3, seed=0, max_len_a=0.0, max_len_b=4, min_len=2):
        assert all(2 <= len(h.tokens) <= 4 for h in hyps)


def test_translate_job_samples_n_per_line_reproducibly(tmp_path_factory, tmp_path):
    # Hydra is imported here, not at module level: this module's gpu test must import on a
    # GPU image without hydra-core (tests/integration/gpu/test_gpu_imports.py)
    from hydra import compose, initialize_config_dir

    from litmt.cli.script.config_check import expand_short_overrides
    from litmt.cli.translate import translate

    ckpt = tiny_checkpoint_path(tmp_path_factory)
    src = tmp_path / "mono.en"
    src.write_text("A red dog runs.\nA small cat sleeps here.\n")

    def run(out: Path, seed: int) -> list[str]:
        overrides = [
            f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "method=sample",
            "n_best=3", f"seed={seed}", "top_p=0.9", "device=cpu",
        ]  # fmt: skip
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            # the short form (method=sample) spelled out as scripts/translate.py does
            cfg = compose("translate", expand_short_overrides(overrides, "translate", CONF))
            assert translate(cfg) == 2
        return out.read_text().splitlines()

    lines = run(tmp_path / "a.de", 4)
    assert len(lines) == 6 and [line.split("\t")[0] for line in lines] == list("000111")
    assert run(tmp_path / "b.de", 4) == lines
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        DecodeConfig(method="sample", temperature=-0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampling_and_ensembles_on_cuda():
    """The generator lives on the GPU; an ensemble's states stay there."""
    model, src = random_model().cuda(), sources().cuda()
    first = sample(model, src, n_best=3, seed=2)
    assert tokens(first) == tokens(sample(model, src, n_best=3, seed=2))
    greedy = greedy_search(model, src)
    assert [h[0].tokens for h in sample(model, src, temperature=0.0)] == [g.tokens for g in greedy]
    pair = decode([model, copy.deepcopy(model)], src, DecodeConfig(beam_size=3))
    assert tokens(pair) == tokens(decode(model, src, DecodeConfig(beam_size=3)))
