"""Data prepared once per node (issue 16 item 8): ranks started together (torchrun, SLURM)
train the tokenizer once; the others wait for the preparer's marker, then read its caches."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from train_utils import (
    REPO,
    TWO_CPU_RANKS,
    free_port,
    script_env,
    tiny_overrides,
    write_toy_corpus,
)

from litmt.data import TranslationDataModule
from litmt.data.preparation.once import launch_ranks
from litmt.errors import DataError

# One rank of a torchrun-style job: both processes exist from the start (LOCAL_RANK in the
# environment, so Lightning does not launch them) and meet at a file barrier right before
# `train`, so that without the prepare-once rule both would train sentencepiece at once.
RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, logging, os, sys, time
    from pathlib import Path

    logging.basicConfig(level=logging.INFO)
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    rank = os.environ["RANK"]
    from litmt.data.tokenization import tokenizer as tk
    from litmt.data.datamodule import TranslationDataModule

    train_tokenizer = tk.Tokenizer.train.__func__

    def counted(cls, *args, **kwargs):
        with open(out / "tokenizer_trainings", "a") as f:
            f.write(rank + "\\n")
        time.sleep(2.0)  # a slow trainer: another rank arriving meanwhile would train too
        return train_tokenizer(cls, *args, **kwargs)

    tk.Tokenizer.train = classmethod(counted)
    setup = TranslationDataModule.setup

    def recording_setup(self, stage=None):
        setup(self, stage)
        tok = self.tokenizer
        digest = hashlib.sha256(tok.src_model_bytes + (tok.tgt_model_bytes or b"")).hexdigest()
        (out / f"vocab.{rank}.json").write_text(json.dumps({"digest": digest,
                                                            "size": tok.src_vocab_size}))

    TranslationDataModule.setup = recording_setup

    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict
    from litmt.cli.train import train

    with initialize_config_dir(config_dir=os.environ["LITMT_CONF"], version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out / "run")
    (out / f"ready.{rank}").touch()
    while not all((out / f"ready.{r}").exists() for r in ("0", "1")):
        time.sleep(0.05)
    train(cfg)
    import torch.distributed as dist
    (out / f"group_left.{rank}").write_text(str(not dist.is_initialized()))
    """
)


@pytest.mark.slow
def test_two_gloo_ranks_started_together_train_the_tokenizer_once(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 120, "valid": 8, "test": 8})
    over = [
        *tiny_overrides(corpus, tmp_path),
        *TWO_CPU_RANKS,
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1",
        "callbacks=none",
        "logger=csv",
        "test_after_training=false",
    ]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **script_env(),
            "LITMT_CONF": str(REPO / "conf"),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path), *over],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-4000:]
    trainings = (tmp_path / "tokenizer_trainings").read_text().split()
    assert trainings == ["0"], f"sentencepiece trained by ranks {trainings}"
    vocab = [json.loads((tmp_path / f"vocab.{r}.json").read_text()) for r in (0, 1)]
    assert vocab[0] == vocab[1]
    assert "waiting for local rank 0 of this node" in outputs[1][1]
    # each rank left its gloo group when `train` returned (an exit with the group alive can
    # abort at interpreter shutdown: litmt.runtime.distributed)
    left = [(tmp_path / f"group_left.{r}").read_text() for r in (0, 1)]
    assert left == ["True", "True"]


# -- the pieces, in one process --------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, (0, 0)),
        ({"LOCAL_RANK": "3", "NODE_RANK": "1"}, (3, 1)),
        ({"LOCAL_RANK": "2", "GROUP_RANK": "4"}, (2, 4)),  # torchrun
        ({"SLURM_LOCALID": "5", "SLURM_NODEID": "2"}, (5, 2)),
    ],
)
def test_launch_ranks_read_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict, want: tuple[int, int]
) -> None:
    for key in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_LOCALID", "SLURM_NODEID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launch_ranks() == want


@pytest.mark.parametrize(
    ("per_node", "local", "node", "prepares"),
    [(True, 0, 0, True), (True, 0, 1, True), (True, 1, 0, False),
     (False, 0, 0, True), (False, 0, 1, False)],
)  # fmt: skip
def test_who_prepares_follows_prepare_data_per_node(
    monkeypatch: pytest.MonkeyPatch, dm_kwargs: dict, per_node, local, node, prepares
) -> None:
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.setenv("NODE_RANK", str(node))
    dm = TranslationDataModule(**dm_kwargs, prepare_data_per_node=per_node)
    assert dm.is_preparer() is prepares


def test_waiting_rank_reads_the_caches_after_the_marker(
    monkeypatch: pytest.MonkeyPatch, dm_kwargs: dict, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    first = TranslationDataModule(**dm_kwargs)
    with caplog.at_level(logging.INFO, logger="litmt.data"):
        first.prepare_once()
    assert json.loads(first.prepared_marker().read_text())["status"] == "ok"
    # visible progress while tokenising: a line before and after each split
    assert "tokenizer: training sentencepiece on " in caplog.text
    assert "tokenising train: " in caplog.text and "done in" in caplog.text

    monkeypatch.setenv("LOCAL_RANK", "1")
    waiter = TranslationDataModule(**dm_kwargs)
    waiter.prepare_once()  # returns at once: the marker and every cache exist
    waiter.setup("fit")
    assert waiter.tokenizer.src_model_bytes == first.tokenizer.src_model_bytes


def test_waiting_rank_fails_when_the_preparer_fails(
    monkeypatch: pytest.MonkeyPatch, dm_kwargs: dict
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    waiter = TranslationDataModule(**dm_kwargs, prepare_timeout=0.3)
    marker = waiter.prepared_marker()
    marker.parent.mkdir(parents=True)
    started = time.time()
    # a failed marker from an earlier run is ignored: the waiter times out instead
    marker.write_text(json.dumps({"status": "failed", "paths": []}))
    os.utime(marker, (started - 3600, started - 3600))
    with pytest.raises(DataError, match=r"^waited 0s for local rank 0 of this node"):
        waiter.prepare_once(poll_s=0.05)
    marker.write_text(json.dumps({"status": "failed", "paths": []}))  # written by this job
    waiter = TranslationDataModule(**dm_kwargs, prepare_timeout=30)
    with pytest.raises(DataError, match="data preparation failed in local rank 0 of this node"):
        waiter.prepare_once(poll_s=0.05)


def test_preparer_writes_a_failed_marker_and_reraises(
    monkeypatch: pytest.MonkeyPatch, dm_kwargs: dict
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    dm = TranslationDataModule(**dm_kwargs)

    def broken() -> None:
        raise DataError("the corpus is unreadable")

    monkeypatch.setattr(dm, "_get_tokenizer", broken)
    with pytest.raises(DataError, match="unreadable"):
        dm.prepare_once()
    assert json.loads(dm.prepared_marker().read_text())["status"] == "failed"
