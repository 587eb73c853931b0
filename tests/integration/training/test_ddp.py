"""DDP on CPU (gloo): every rank's hypotheses are gathered before scoring, so validation
BLEU equals a one-process evaluation of the same checkpoint; no example is trained on twice
in an epoch."""

from __future__ import annotations

import json
import math
import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import hydra
import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.strategies import DDPStrategy
from train_utils import (
    TWO_CPU_RANKS,
    compose_train,
    free_port,
    run_train_script,
    start_method,
    tiny_overrides,
    write_toy_corpus,
)

from litmt.checkpoint.io import load_checkpoint
from litmt.training.callbacks.validation_bleu import ValidationBleu, gather_hypotheses
from litmt.training.module import TranslationModule
from litmt.training.schedules import time_budget_progress, warmup_scheduler

EPOCHS = 20
REFS = [f"sentence {i}" for i in range(7)]
# rank 0 and rank 1 decoded interleaved examples; index 3 was padded in twice (a duplicate)
PAIRS = {0: [(0, "h0"), (2, "h2"), (4, "h4"), (6, "h6")], 1: [(1, "h1"), (3, "h3"), (5, "h5"), (3, "h3")]}  # fmt: skip


def _gather_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        full = gather_hypotheses(list(PAIRS[rank]), len(REFS))
        partial = gather_hypotheses(PAIRS[rank][:2], len(REFS))  # 4-6 missing: a partial run
        Path(out, f"{rank}.json").write_text(json.dumps({"full": full, "partial": partial}))
    finally:
        dist.destroy_process_group()


def test_gather_hypotheses_across_two_gloo_ranks(tmp_path: Path) -> None:
    """Fast: both ranks get every hypothesis once, in corpus order; partial runs get None."""
    port = free_port()
    mp.start_processes(
        _gather_worker,
        args=(2, port, str(tmp_path)),
        nprocs=2,
        join=True,
        start_method=start_method(),
    )
    for rank in (0, 1):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["full"] == [f"h{i}" for i in range(7)]
        assert got["partial"] is None


def _clock_worker(rank: int, world: int, port: int, out: str) -> None:
    """Rank r's own clock says 30 + r seconds of a 100 s budget."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        timer = Timer(duration=timedelta(seconds=100))
        timer.time_elapsed = lambda *a: 30.0 + rank  # type: ignore[method-assign]
        timer.time_remaining = lambda *a: 70.0 - rank  # type: ignore[method-assign]
        trainer = SimpleNamespace(callbacks=[timer], world_size=world, strategy=DDPStrategy())
        progress, _ = time_budget_progress(trainer)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = warmup_scheduler(
            opt, trainer, name="cosine", warmup_steps=1, min_lr_ratio=0.0, total_steps=None,
            horizon="time",
        )  # fmt: skip
        opt.step()
        sched.step()
        got = {"progress": progress(), "lr": opt.param_groups[0]["lr"]}
        Path(out, f"{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def test_the_time_budget_progress_is_rank_0s_clock_on_every_rank(tmp_path: Path) -> None:
    """Fast: ranks whose clocks differ (30 s and 31 s) get rank 0's progress and the same LR
    (Lightning's DDPStrategy.broadcast over gloo), so the replicas stay identical."""
    mp.start_processes(
        _clock_worker,
        args=(2, free_port(), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method=start_method(),
    )
    got = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert got[0]["progress"] == got[1]["progress"] == pytest.approx(0.30)
    assert got[0]["lr"] == got[1]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.30)))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_process_ddp_trains_scores_like_one_process_and_sees_each_example_once(
    tmp_path: Path,
) -> None:
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 400, "valid": 30, "test": 10})
    over = [
        *tiny_overrides(corpus, tmp_path),
        *TWO_CPU_RANKS,
        "data.max_tokens=256",  # ~8 steps an epoch per rank
        f"trainer.max_epochs={EPOCHS}",
        f"trainer.check_val_every_n_epoch={EPOCHS // 2}",
        "module.optimizer.lr=3e-3",
        "module.scheduler.warmup_steps=20",
        "test_after_training=false",
        "+callbacks.record._target_=probe_callbacks.RecordBatches",
        f"+callbacks.record.out_dir={tmp_path / 'record'}",
    ]
    proc = run_train_script(over, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "run directory:" in proc.stdout

    ranks = [read_jsonl(tmp_path / "record" / f"rank{r}.jsonl") for r in (0, 1)]
    steps = [[r for r in recs if "loss" in r] for recs in ranks]
    assert all(r["world"] == 2 for rs in steps for r in rs)
    assert len(steps[0]) == len(steps[1]) > 0  # equal batch counts: no rank waits forever

    # no example is seen twice in an epoch, and every example is seen once per epoch
    cfg = compose_train(over, tmp_path)
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup("fit")
    n_train = len(dm.datasets["train"])
    for epoch in range(EPOCHS):
        seen = [i for rs in steps for r in rs if r["epoch"] == epoch for i in r["index"]]
        assert len(seen) == len(set(seen)) == n_train, f"epoch {epoch}"

    # both ranks decoded a share of the validation set; the score covers all of it
    val = [{i for r in recs if "val_index" in r for i in r["val_index"]} for recs in ranks]
    assert val[0] and val[1] and val[0] | val[1] == set(range(30))
    bleu = [[r["valid_bleu"] for r in recs if "valid_bleu" in r] for recs in ranks]
    assert len(bleu[0]) == 2 and bleu[0] == bleu[1]
    ddp_bleu = bleu[0][-1]
    assert ddp_bleu > 5, f"DDP run did not learn (valid BLEU {ddp_bleu:.2f})"

    # one process, the checkpoint written at the end of that last validation
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    module = TranslationModule(ckpt["litmt"]["model_config"], dm.tokenizer, "en", "de")
    module.load_state_dict(ckpt["state_dict"])
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
        callbacks=[ValidationBleu(beam_size=1)],  # greedy, as the training run's scorer
    )  # fmt: skip
    single = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert single["valid/bleu"] == pytest.approx(ddp_bleu, abs=1e-9)
    assert torch.isfinite(torch.tensor(single["valid/loss"]))


@pytest.mark.slow
def test_sigterm_under_ddp_saves_on_every_rank_then_resumes(tmp_path: Path) -> None:
    """Each rank gets SIGTERM at step 5 (as SLURM sends it to every task): all ranks agree
    on one step, last.ckpt is saved, no collective mismatch or hang; the rerun continues."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 200, "valid": 8, "test": 8})
    over = [
        *tiny_overrides(corpus, tmp_path),
        *TWO_CPU_RANKS,
        "trainer.max_steps=12",
        "test_after_training=false",
        "+callbacks.record._target_=probe_callbacks.RecordBatches",
        f"+callbacks.record.out_dir={tmp_path / 'record'}",
    ]
    kill = ["+callbacks.kill._target_=probe_callbacks.KillAtStep", "+callbacks.kill.step=5"]
    proc = run_train_script([*over, *kill, "+callbacks.kill.sig=SIGTERM"], timeout=600)
    assert proc.returncode == 143, proc.stderr[-4000:]
    assert "stopped by SIGTERM at step 6" in proc.stderr
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 6
    counts = [len(read_jsonl(tmp_path / "record" / f"rank{r}.jsonl")) for r in (0, 1)]

    proc = run_train_script(over, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert load_checkpoint(last)["global_step"] == 12
    for r, n in zip((0, 1), counts, strict=True):
        after = [x for x in read_jsonl(tmp_path / "record" / f"rank{r}.jsonl")[n:] if "loss" in x]
        assert [x["step"] for x in after] == list(range(6, 12))
