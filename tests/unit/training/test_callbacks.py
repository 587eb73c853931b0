"""The scoring callback and the callbacks that act on its score: validation BLEU equals
sacreBLEU on the hypotheses, early stopping counts validations without a BLEU gain, the `best`
checkpoint is the best-BLEU one and the test stage runs on it, the sacreBLEU signature is
logged once."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from probe_callbacks import degrade
from sacrebleu.metrics import BLEU, CHRF
from tiny_checkpoint import corpus, tiny_checkpoint_path
from torch.utils.data import DataLoader
from train_utils import compose_train, tiny_overrides, write_toy_corpus

from litmt.checkpoint.io import load_checkpoint
from litmt.cli.train import train
from litmt.data.batching.collate import collate
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.greedy import greedy_search
from litmt.training.callbacks.validation_bleu import ValidationBleu
from litmt.training.module import TranslationModule

N_VALID = 23


class ValidPairs(L.LightningDataModule):
    """The first N_VALID template pairs as a validation split, in batches of 5 taken in a
    shuffled order (so batch order is not corpus order), like `TranslationDataModule`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__()
        en, de = corpus()
        self.en, self.de = en[:N_VALID], de[:N_VALID]
        src, tgt = tokenizer.encode_src(self.en), tokenizer.encode_tgt(self.de)
        order = np.random.default_rng(0).permutation(N_VALID).tolist()
        self.batches = [
            collate([(i, np.array(src[i]), np.array(tgt[i])) for i in order[k : k + 5]])
            for k in range(0, N_VALID, 5)
        ]

    def references(self, split: str) -> list[str]:
        return list(self.de)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None)  # the batches as they are


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TranslationModule:
    raw = load_checkpoint(tiny_checkpoint_path(tmp_path_factory))
    tokenizer = Tokenizer.from_dict(raw["litmt"]["tokenizer"])
    module = TranslationModule(raw["litmt"]["model_config"], tokenizer, "en", "de")
    module.load_state_dict(raw["state_dict"])
    return module


def validate(module: TranslationModule, **kwargs) -> dict[str, float]:
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ValidationBleu(beam_size=1)],  # greedy, as conf/callbacks/default.yaml
        **kwargs,
    )
    return trainer.validate(module, datamodule=ValidPairs(module.tokenizer), verbose=False)[0]


def test_validation_bleu_is_sacrebleu_on_hypotheses_in_corpus_order(tiny) -> None:
    """One sentence at a time (no padding, corpus order) decodes the same hypotheses as the
    scorer's shuffled, padded batches; the logged BLEU is sacreBLEU's on them."""
    dm = ValidPairs(tiny.tokenizer)
    hyps = []
    with torch.no_grad():
        for sentence in dm.en:
            src = torch.tensor([tiny.tokenizer.encode_src([sentence])[0]])  # (1, S)
            hyps.append(tiny.tokenizer.decode_tgt([greedy_search(tiny.model, src)[0].tokens])[0])
    want = BLEU().corpus_score(hyps, [dm.de]).score
    # a model that translates, and distinct sentences: hypotheses out of order would score low
    assert want > 20 and len(set(hyps)) == N_VALID
    got = validate(tiny)
    assert got["valid/bleu"] == pytest.approx(want, abs=1e-9)
    assert "valid/chrf" in got


def test_the_scorer_decodes_through_the_strategys_wrapper(tiny) -> None:
    """`trainer.model` (DDP's or FSDP's wrapper under those strategies) runs the decoding, so
    FSDP gathers its sharded weights for it; the module's `forward` is the decoder."""

    class Wrapper(torch.nn.Module):  # stands in for DistributedDataParallel / FSDP
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.module(*args, **kwargs)

    wrapper = Wrapper(tiny)
    trainer = SimpleNamespace(model=wrapper, strategy=None)
    pl_module = SimpleNamespace(trainer=trainer, tokenizer=tiny.tokenizer)
    batch = ValidPairs(tiny.tokenizer).batches[0]
    scorer = ValidationBleu(beam_size=2)
    with torch.no_grad():
        hyps = scorer.hypotheses(pl_module, batch)  # type: ignore[arg-type]
        found = decode(tiny.model, batch["src"], DecodeConfig(beam_size=2))
        want = tiny.tokenizer.decode_tgt([h[0].tokens for h in found])
    assert wrapper.calls == 1 and hyps == want


def test_decoding_runs_in_lock_step_only_across_ranks_that_shard_parameters(monkeypatch) -> None:
    """`sync_steps` (every rank the same number of decoder steps) under FSDP with 2 ranks;
    not under DDP, nor without a process group (see tests/unit/decoding/search/test_sync_steps.py)."""
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from litmt.training.callbacks import validation_bleu

    assert not validation_bleu.lockstep(FSDPStrategy())  # no process group
    monkeypatch.setattr(validation_bleu.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(validation_bleu.dist, "get_world_size", lambda: 2)
    assert validation_bleu.lockstep(FSDPStrategy())
    assert not validation_bleu.lockstep(DDPStrategy())


def test_a_partial_validation_logs_no_bleu(tiny) -> None:
    got = validate(tiny, limit_val_batches=2)  # 10 of the 23 sentences
    assert "valid/loss" in got and "valid/bleu" not in got


# -- early stopping, the best checkpoint and the test stage (one scripted run) --------------

# BLEU of validation 1, 2, ...: best at validation 2, then PATIENCE validations without a gain
QUALITY = [0.2, 0.9, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]
PATIENCE = 3


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`litmt.cli.train.train` with the shipped callbacks config; only the scorer's hypotheses
    are scripted (probe_callbacks.ScriptedScorer), so validation BLEU follows QUALITY."""
    out = tmp_path_factory.mktemp("scripted")
    corpus_dir = write_toy_corpus(out / "corpus", {"train": 60, "valid": 12, "test": 6})
    overrides = [
        *tiny_overrides(corpus_dir, out),
        f"trainer.max_epochs={len(QUALITY)}",
        "module.optimizer.lr=3e-3",  # the weights change at every step
        "module.scheduler.warmup_steps=4",
        "callbacks.bleu._target_=probe_callbacks.ScriptedScorer",
        f"+callbacks.bleu.quality=[{','.join(map(str, QUALITY))}]",
        f"callbacks.early_stopping.patience={PATIENCE}",
        "+callbacks.test_weights._target_=probe_callbacks.RecordTestWeights",
        f"+callbacks.test_weights.path={out / 'test_weights.pt'}",
        "+logger.record._target_=probe_callbacks.RecordingLogger",
        f"+logger.record.path={out / 'hparams.jsonl'}",
    ]
    metrics = train(compose_train(overrides, out))
    with open(next((out / "run" / "csv").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    return {"out": out, "metrics": metrics, "rows": rows}


def _validations(run: dict) -> list[tuple[int, float]]:
    """(step, valid/bleu) of every validation, from the CSV log."""
    return [(int(r["step"]), float(r["valid/bleu"])) for r in run["rows"] if r.get("valid/bleu")]


def test_early_stopping_stops_after_patience_validations_without_a_bleu_gain(scripted_run):
    bleu = [b for _, b in _validations(scripted_run)]
    best = 2  # QUALITY's maximum before the stop
    assert len(bleu) == best + PATIENCE  # stopped; max_epochs would allow len(QUALITY)
    assert max(bleu) == bleu[best - 1] and all(b < bleu[best - 1] for b in bleu[best:])
    assert len(set(bleu)) == len(bleu)  # the scripted scores really differ


def test_the_best_checkpoint_has_the_highest_bleu_and_the_test_stage_uses_it(scripted_run):
    bleu = [b for _, b in _validations(scripted_run)]
    best = Path(scripted_run["metrics"]["best_checkpoint"])
    match = re.fullmatch(r"best-step(\d+)-bleu([\d.]+)\.ckpt", best.name)
    assert match, best.name
    assert float(match[2]) == pytest.approx(max(bleu), abs=0.005)
    step = load_checkpoint(best)["global_step"]
    last_step = load_checkpoint(scripted_run["metrics"]["last_checkpoint"])["global_step"]
    assert step == int(match[1])
    assert step * len(bleu) == last_step * 2  # saved at validation 2 of 5 (one per epoch)
    best_weights = load_checkpoint(best)["state_dict"]
    last_weights = load_checkpoint(scripted_run["metrics"]["last_checkpoint"])["state_dict"]
    tested = torch.load(scripted_run["out"] / "test_weights.pt", weights_only=True)
    assert tested.keys() == best_weights.keys()
    assert all(torch.equal(tested[k], best_weights[k]) for k in best_weights)
    assert not all(torch.equal(tested[k], last_weights[k]) for k in last_weights)  # can fail
    assert scripted_run["metrics"]["test/bleu"] == pytest.approx(100.0)  # the test split ran


def test_the_sacrebleu_signature_is_logged_once(scripted_run):
    calls = [
        json.loads(line)
        for line in (scripted_run["out"] / "hparams.jsonl").read_text().splitlines()
    ]
    signed = [c for c in calls if "sacrebleu/bleu_signature" in c]
    assert len(signed) == 1  # not once per validation (5) nor again for the test stage
    for key, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        metric.corpus_score(["a b c d"], [["a b c d"]])  # sacreBLEU knows nrefs only after a score
        assert signed[0][f"sacrebleu/{key}_signature"] == str(metric.get_signature())


def test_degrade_scores_rise_with_quality() -> None:
    """The scripted hypotheses' BLEU is monotone in the quality (the fixture relies on it)."""
    refs = ["ein mann geht auf der strasse im park", "eine katze sitzt", "der hund rennt schnell"]
    scores = [
        BLEU().corpus_score([degrade(r, q) for r in refs], [refs]).score for q in sorted(QUALITY)
    ]
    assert scores == sorted(scores) and scores[-1] == pytest.approx(100.0)
