"""Real multi-process DDP (gloo, CPU): distinct train batches, equal counts, no hang; with
three directions at T=5, every rank draws the same examples each epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from temperature_corpus import BIG, temperature_kwargs

from litmt.data import TranslationDataModule

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import lightning as L
    import torch
    from litmt.data import TranslationDataModule

    out, kwargs = sys.argv[1], json.loads(sys.argv[2])

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.train_idx, self.val_idx = [], []

        def training_step(self, batch, batch_idx):
            self.train_idx.append([self.current_epoch, batch["index"].tolist()])
            return (self.w - batch["tgt_out"].float().mean()) ** 2

        def validation_step(self, batch, batch_idx):
            self.val_idx.append(batch["index"].tolist())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Recorder()
    trainer = L.Trainer(
        accelerator="cpu", devices=int(kwargs.pop("devices")), strategy="ddp",
        max_epochs=int(kwargs.pop("max_epochs", 1)),
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0,
        use_distributed_sampler=kwargs.pop("use_distributed_sampler"),
    )
    dm = TranslationDataModule(**kwargs)
    trainer.fit(model, datamodule=dm)
    with open(f"{out}.{trainer.global_rank}.json", "w") as f:
        json.dump({"train": model.train_idx, "val": model.val_idx}, f)
    """
)


def run(
    tmp_path: Path, dm_kwargs: dict, world: int, use_distributed_sampler: bool, epochs: int = 1
):
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    kw = {**dm_kwargs, "devices": world, "use_distributed_sampler": use_distributed_sampler}
    kw["max_epochs"] = epochs
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out"), json.dumps(kw)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_get_distinct_batches(tmp_path: Path, dm_kwargs: dict, world: int) -> None:
    proc = run(tmp_path, dm_kwargs, world, use_distributed_sampler=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(world)]
    assert len({len(r["train"]) for r in ranks}) == 1  # equal batch counts: no hang
    train = sorted(i for r in ranks for _, b in r["train"] for i in b)
    assert len(train) == len(set(train))  # no example on two ranks
    assert len({len(r["val"]) for r in ranks}) == 1
    val = sorted(set(i for r in ranks for b in r["val"] for i in b))
    assert val == list(range(40))  # the whole validation split, gathered over ranks


@pytest.mark.slow
def test_ddp_with_lightning_distributed_sampler_is_refused(tmp_path: Path, dm_kwargs: dict) -> None:
    proc = run(tmp_path, dm_kwargs, 2, use_distributed_sampler=True)
    assert proc.returncode != 0
    assert "set trainer.use_distributed_sampler=false" in proc.stderr


@pytest.mark.slow
def test_ddp_ranks_draw_the_same_temperature_sample(tmp_path: Path, dm_kwargs: dict) -> None:
    """Three directions at T=5 on 2 ranks for 2 epochs: each epoch, the ranks' batches
    together hold exactly the examples one process draws for that epoch (the draw is a
    function of (seed, epoch), so no rank draws its own), with equal batch counts."""
    kw = temperature_kwargs(tmp_path / "t5", dm_kwargs)
    proc = run(tmp_path, kw, 2, use_distributed_sampler=False, epochs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(2)]
    one = TranslationDataModule(**kw)
    one.setup("fit")
    loader = one.train_dataloader()
    draws = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        expected = Counter(i for b in loader for i in b["index"].tolist())
        per_rank = [[b for e, b in r["train"] if e == epoch] for r in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) > 0
        assert Counter(i for batches in per_rank for b in batches for i in b) == expected
        draws.append(sorted(i for i in expected if i < BIG))
    assert draws[0] != draws[1]  # en-de is drawn again in epoch 1
