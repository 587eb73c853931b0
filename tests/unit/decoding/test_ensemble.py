"""Ensembles: the mean of the members' probabilities at every step, each with its own state."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from tiny_checkpoint import _batch, corpus, tiny_checkpoint_path
from tiny_checkpoint import tiny_config as translator_config
from tiny_model import tiny_config

from litmt.checkpoint.io import save_model_checkpoint
from litmt.cli.evaluate import evaluate
from litmt.cli.script.config_check import expand_short_overrides
from litmt.data.tokenization.tokenizer import BOS_ID, Tokenizer, TokenizerConfig
from litmt.decoding.config import DecodeConfig
from litmt.decoding.ensemble import Ensemble
from litmt.decoding.search.dispatch import decode
from litmt.decoding.translator import Translator
from litmt.deploy.loader import load_translator
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

CONF = Path(__file__).resolve().parents[3] / "conf"
VOCAB = 40
CONFIGS = [
    DecodeConfig(method="greedy"),
    DecodeConfig(beam_size=4, n_best=3, length_penalty=0.6),
    DecodeConfig(method="sample", n_best=3, seed=3, top_k=10),
]


def random_model(seed: int) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB)).eval()


def sources() -> torch.Tensor:
    src = torch.randint(4, VOCAB, (5, 8), generator=torch.Generator().manual_seed(1))
    src[1, 5:] = src[3, 2:] = 0  # padded rows
    return src


def assert_same(a, b, tol: float = 1e-5) -> None:
    for hyps_a, hyps_b in zip(a, b, strict=True):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        for ha, hb in zip(hyps_a, hyps_b, strict=True):
            assert ha.log_prob == pytest.approx(hb.log_prob, abs=tol)
            assert ha.score == pytest.approx(hb.score, abs=tol)


def test_ensemble_step_is_the_log_of_the_mean_probability():
    models = [random_model(0), random_model(1)]
    references = [copy.deepcopy(m).double() for m in models]  # float64, full passes
    ensemble = Ensemble(models)
    src, prefix = sources()[:2], torch.tensor([[BOS_ID, 7, 9, 11]] * 2)
    memory, mask = ensemble.encode(src)
    state = ensemble.init_state(memory, mask)
    for t in range(prefix.size(1)):
        got = ensemble.decode_step(prefix[:, t], state)  # (2, V)
        with torch.no_grad():
            probs = [F.softmax(m(src, prefix[:, : t + 1])[:, -1], dim=-1) for m in references]
        want = torch.log((probs[0] + probs[1]) / 2)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.method)
def test_an_ensemble_of_one_is_that_model(config):
    model = random_model(0)
    assert_same(decode([model], sources(), config), decode(model, sources(), config))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.method)
def test_an_ensemble_of_two_identical_models_is_one(config):
    model = random_model(0)
    pair = [model, copy.deepcopy(model)]
    assert_same(decode(pair, sources(), config), decode(model, sources(), config))


def test_members_may_not_differ_in_vocabulary_size():
    with pytest.raises(ConfigError, match="must share the vocabulary"):
        Ensemble([random_model(0), Seq2SeqTransformer(tiny_config(src_vocab_size=50))])


@pytest.mark.parametrize("short_first", [True, False], ids=["short_first", "short_last"])
def test_an_ensembles_max_positions_is_its_smallest_members(short_first):
    """Every member must read the source and every output position, so the shortest
    `max_positions` (12 here, beside 64) bounds both, whichever member it is."""
    torch.manual_seed(1)
    short = Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB, max_positions=12)).eval()
    long = random_model(0)
    assert long.config.max_positions == 64
    members = [short, long] if short_first else [long, short]
    assert Ensemble(members).config.max_positions == 12
    # the output budget is max_positions - 1 = 11 tokens, not the long member's 63: these
    # untrained models never end early, so each hypothesis runs to the budget
    for config in (DecodeConfig(method="greedy", max_len_a=0, max_len_b=100),
                   DecodeConfig(beam_size=3, max_len_a=0, max_len_b=100)):  # fmt: skip
        out = decode(members, sources(), config)
        assert [len(h.tokens) for hyps in out for h in hyps] == [11] * 5, config
        assert all(len(h.tokens) == 63 for hyps in decode(long, sources(), config) for h in hyps)
    # a source of 13 tokens fits the long member, not the short one: refused
    with pytest.raises(
        ConfigError, match=r"source of 13 tokens exceeds the model's max_positions=12"
    ):
        decode(members, torch.randint(4, VOCAB, (1, 13)), DecodeConfig(method="greedy"))


def train_member(tokenizer: Tokenizer, seed: int, out: Path, steps: int = 60) -> Path:
    """Another tiny translator (as `tiny_checkpoint.build_tiny_checkpoint`), own seed."""
    torch.manual_seed(seed)
    en, de = corpus()
    model = Seq2SeqTransformer(translator_config(tokenizer.src_vocab_size))
    src_ids, tgt_ids = tokenizer.encode_src(en), tokenizer.encode_tgt(de)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    for _ in range(steps):
        idx = [rng.randrange(len(en)) for _ in range(32)]
        src = _batch([src_ids[i] for i in idx], bos_eos=False)
        tgt = _batch([tgt_ids[i] for i in idx], bos_eos=True)
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_model_checkpoint(out, model.eval(), tokenizer, "en", "de")


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> list[Path]:
    first = tiny_checkpoint_path(tmp_path_factory)
    tokenizer = Translator.from_checkpoint(first, device="cpu").tokenizer
    out = tmp_path_factory.mktemp("ensemble")
    return [first, train_member(tokenizer, seed=1, out=out / "second.ckpt")]


def test_two_different_checkpoints_differ_and_beat_chance(members, tmp_path):
    en, de = corpus(seed=5)
    src, ref, shuffled = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "shuffled.de"
    src.write_text("\n".join(en[:40]) + "\n")
    ref.write_text("\n".join(de[:40]) + "\n")
    shuffled.write_text("\n".join(de[1:41]) + "\n")  # every line the reference of another

    def bleu(ckpts: list[Path], refs: Path, *extra: str) -> float:
        paths = "[" + ",".join(str(p) for p in ckpts) + "]"
        overrides = [f"ckpt_path={paths}", f"src_file={src}", f"ref_file={refs}", *extra]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            args = [
                *overrides,
                "beam_size=2",
                "progress=false",
            ]  # as scripts/evaluate.py reads them
            cfg = compose("evaluate", expand_short_overrides(args, "evaluate", CONF))
        return evaluate(cfg)["bleu"]

    ensemble = bleu(members, ref, "ensemble=true")
    chance = bleu(members, shuffled, "ensemble=true")
    assert ensemble > chance + 20, (ensemble, chance)

    sents = en[:20]
    pair = Translator.from_checkpoint(members, device="cpu", ensemble=True)
    assert len(pair.models) == 2
    got = pair.translate(sents, beam_size=2, return_scores=True)
    for single in members:
        alone = Translator.from_checkpoint(single, device="cpu").translate(
            sents, beam_size=2, return_scores=True
        )
        assert any(abs(a[0][1] - b[0][1]) > 1e-3 for a, b in zip(got, alone, strict=True))
    averaged = Translator.from_checkpoint(members, device="cpu")  # weights averaged: one model
    assert len(averaged.models) == 1


def test_checkpoints_with_another_tokenizer_are_refused(members, tmp_path):
    en, de = corpus()
    other = Tokenizer.train(en, de, TokenizerConfig(vocab_size=70, model_type="unigram"))
    model = Seq2SeqTransformer(tiny_config(src_vocab_size=other.src_vocab_size))
    odd = save_model_checkpoint(tmp_path / "odd.ckpt", model, other, "en", "de")
    with pytest.raises(ConfigError, match="ensemble members must share the vocabulary") as err:
        Translator.from_checkpoint([members[0], odd], device="cpu", ensemble=True)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="engine=ct2 does not ensemble"):
        load_translator(members, engine="ct2", ensemble=True)
