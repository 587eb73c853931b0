"""16-mixed, bf16-mixed, FSDP/DDP and FP8 training through the Hydra path on CUDA (marked
`gpu`, skipped without one).

This module imports without hydra-core, omegaconf, datasets and wandb (the GPU image lacks
them; tests/integration/gpu/test_gpu_imports.py checks it): the Hydra path is imported inside the
tests, which skip where it cannot run. scripts/gpu_check.py measures the same on the GPU
without Hydra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from litmt.checkpoint.io import load_checkpoint

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _hydra_path() -> Any:
    """train_utils (Hydra composition); skips where hydra-core or `datasets` is absent."""
    pytest.importorskip("hydra", reason="the Hydra training path needs hydra-core")
    pytest.importorskip("datasets", reason="the data module needs datasets")
    import train_utils

    return train_utils


def _few_steps(tmp_path: Path, extra: list[str]) -> dict:
    tu = _hydra_path()
    from litmt.cli.train import train

    corpus = tu.write_toy_corpus(tmp_path / "corpus", {"train": 80, "valid": 6, "test": 6})
    over = [o for o in tu.tiny_overrides(corpus, tmp_path) if o != "trainer.accelerator=cpu"]
    cfg = tu.compose_train(
        [
            *over,
            "trainer.max_steps=3",
            "trainer.log_every_n_steps=1",
            "test_after_training=false",
            *extra,
        ],
        tmp_path,
    )
    return train(cfg)


@pytest.mark.gpu
@needs_cuda
def test_16_mixed_on_gpu_uses_loss_scaling(tmp_path: Path, monkeypatch) -> None:
    _hydra_path()
    import litmt.cli.train as train_mod

    captured = {}
    build_trainer = train_mod.build_trainer

    def grab(cfg, callbacks, loggers):
        trainer = build_trainer(cfg, callbacks, loggers)
        captured["scaler"] = getattr(trainer.precision_plugin, "scaler", None)
        captured["device"] = trainer.strategy.root_device
        return trainer

    monkeypatch.setattr(train_mod, "build_trainer", grab)
    metrics = _few_steps(tmp_path, ["trainer=gpu", "trainer.precision=16-mixed"])
    assert captured["device"].type == "cuda"
    assert isinstance(captured["scaler"], torch.amp.GradScaler)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


@pytest.mark.gpu
@needs_cuda
def test_bf16_mixed_on_gpu(tmp_path: Path) -> None:
    metrics = _few_steps(tmp_path, ["trainer=gpu"])
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_multi_gpu_strategy_trains_and_checkpoint_reloads(strategy: str, tmp_path: Path) -> None:
    """FSDP (or DDP) over every visible GPU, a few steps, in a subprocess (the real script);
    the full (unsharded) checkpoint loads like any other."""
    tu = _hydra_path()
    devices = torch.cuda.device_count()
    corpus = tu.write_toy_corpus(tmp_path / "corpus", {"train": 200, "valid": 8, "test": 8})
    over = [o for o in tu.tiny_overrides(corpus, tmp_path) if o != "trainer.accelerator=cpu"]
    proc = tu.run_train_script(
        [
            *over,
            f"trainer={strategy}",
            f"trainer.devices={devices}",
            "trainer.max_steps=6",
            "test_after_training=false",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 6
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="needs transformer_engine"
)
def test_fp8_transformer_engine_runs_a_few_steps(tmp_path: Path) -> None:
    metrics = _few_steps(
        tmp_path, ["trainer=gpu", "trainer.precision=transformer-engine", "attention=math"]
    )
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
