"""Through a real Lightning `Trainer`: epochs reshuffle, and a mid-epoch checkpoint resumes
with exactly the batches that were not yet seen; also with three directions at T=5, whose
downsampled direction is drawn again every epoch."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from temperature_corpus import BIG, SMALL, temperature_kwargs

from litmt.data import TranslationDataModule


class Recorder(L.LightningModule):
    """A one-parameter model that records the example indexes of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, tuple[int, ...]]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, tuple(batch["index"].tolist())))
        return (self.w - batch["tgt_out"].float().mean()) ** 2

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(dm_kwargs: dict, root: Path, ckpt: str | None = None, **trainer_kw: object) -> Recorder:
    model = Recorder()
    trainer_kw.setdefault("max_epochs", 2)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, default_root_dir=root,
        num_sanity_val_steps=0, limit_val_batches=0, **trainer_kw,
    )  # fmt: skip
    trainer.fit(model, datamodule=TranslationDataModule(**dm_kwargs), ckpt_path=ckpt)
    return model


@pytest.mark.parametrize(
    ("offset", "corpus"), [(2, "one-pair"), (0, "one-pair"), (-1, "one-pair"), (2, "t5")]
)
def test_mid_epoch_resume_through_lightning(
    dm_kwargs: dict, tmp_path: Path, offset: int, corpus: str
) -> None:
    logging.getLogger("lightning").setLevel(logging.ERROR)
    if corpus == "t5":
        dm_kwargs = temperature_kwargs(tmp_path / "t5", dm_kwargs)
    full = fit(dm_kwargs, tmp_path / "a").seen
    e0 = [b for e, b in full if e == 0]
    e1 = [b for e, b in full if e == 1]
    per_epoch = len(e0)
    assert per_epoch >= 4
    assert e0 != e1  # a new order each epoch (set_epoch works)
    seen0, seen1 = (sorted(i for b in e for i in b) for e in (e0, e1))
    if corpus == "one-pair":
        assert len(e0) == len(e1) and seen0 == seen1  # every example once per epoch
    else:  # the same share per direction, a new subset of en-de (the batch count may vary)
        assert len(seen0) == len(seen1) == BIG + 2 * SMALL and seen0 != seen1  # none cut
        assert sum(i < BIG for i in seen0) == sum(i < BIG for i in seen1)

    stop = per_epoch + offset  # into epoch 1, exactly at the end of epoch 0, or just before
    cb = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ck", every_n_train_steps=stop, save_top_k=-1, filename="{step}"
    )
    part = fit(dm_kwargs, tmp_path / "b", max_steps=stop, callbacks=[cb]).seen
    assert part == full[:stop]
    ckpt = tmp_path / "ck" / f"step={stop}.ckpt"
    state = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    loader_state = state["combined_loader"][0]
    expect = (1, offset) if offset > 0 else (0, per_epoch + offset)
    assert (loader_state["epoch"], loader_state["consumed"]) == expect

    rest = fit(dm_kwargs, tmp_path / "c", ckpt=str(ckpt)).seen
    assert rest == full[stop:]


@pytest.mark.parametrize("num_workers", [2])
def test_mid_epoch_resume_with_workers(dm_kwargs: dict, tmp_path: Path, num_workers: int) -> None:
    """Workers prefetch ahead of training; the checkpoint still stores what was consumed."""
    kw = {**dm_kwargs, "num_workers": num_workers}
    full = fit(kw, tmp_path / "a", max_epochs=1).seen
    stop = 3
    cb = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ck", every_n_train_steps=stop, save_top_k=-1, filename="{step}"
    )
    fit(kw, tmp_path / "b", max_steps=stop, callbacks=[cb])
    rest = fit(kw, tmp_path / "c", ckpt=str(tmp_path / "ck" / f"step={stop}.ckpt"), max_epochs=1)
    assert rest.seen == full[stop:]
