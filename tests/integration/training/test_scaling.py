"""Trainer configs, precisions and launchers: every config composes; bf16-mixed runs on CPU;
16-mixed, FSDP and FP8 on CUDA are in test_scaling_gpu.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from train_utils import CONF, compose_train, tiny_overrides, write_toy_corpus

from litmt.checkpoint.io import load_checkpoint
from litmt.cli.train import build_trainer, train
from litmt.errors import ConfigError

TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))


@pytest.mark.parametrize("name", TRAINERS)
def test_every_trainer_config_composes(name: str, tmp_path: Path) -> None:
    cfg = compose_train([f"trainer={name}"], tmp_path)
    t = cfg.trainer
    assert t._target_ == "lightning.pytorch.trainer.Trainer"
    assert t.precision in ("auto", "32-true", "16-mixed", "bf16-mixed")
    assert t.use_distributed_sampler is False  # the data module shards batches per rank
    if name in ("ddp", "fsdp"):
        assert t.num_nodes == 1 and t.devices > 1


def test_fsdp_strategy_wraps_each_layer(tmp_path: Path) -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from litmt.models.layers import DecoderLayer, EncoderLayer

    cfg = compose_train(["trainer=fsdp"], tmp_path)
    strategy = hydra.utils.instantiate(cfg.trainer.strategy)  # constructing needs no GPU
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy)
    assert set(policy._module_classes) == {EncoderLayer, DecoderLayer}


def test_submitit_launcher_config_follows_the_trainer(tmp_path: Path) -> None:
    """Composes without the plugin installed (it is imported only when a sweep launches)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "hydra/launcher=submitit_slurm",
                "trainer=ddp",
                "trainer.devices=8",
                "trainer.num_nodes=2",
            ],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None, reason="TE is installed"
)
def test_fp8_without_transformer_engine_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=gpu", "trainer.precision=transformer-engine"], tmp_path)
    with pytest.raises(ConfigError, match=r"needs NVIDIA Transformer Engine on a CUDA GPU"):
        build_trainer(cfg, [], [])


def test_unknown_precision_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=cpu", "trainer.precision=fp7"], tmp_path)
    with pytest.raises(ConfigError, match=r"^invalid trainer settings: Precision 'fp7' is invalid"):
        build_trainer(cfg, [], [])


def _few_steps(tmp_path: Path, extra: list[str]) -> dict:
    _needs_datasets()
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 80, "valid": 6, "test": 6})
    over = tiny_overrides(corpus, tmp_path)
    cfg = compose_train(
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


def test_bf16_mixed_on_cpu_smoke(tmp_path: Path) -> None:
    metrics = _few_steps(tmp_path, ["trainer=cpu", "trainer.precision=bf16-mixed"])
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    ckpt = load_checkpoint(metrics["last_checkpoint"])  # saved by the validation at epoch end
    assert 0 < ckpt["global_step"] <= 3
    assert all(t.dtype == torch.float32 for t in ckpt["state_dict"].values())  # fp32 masters


def _needs_datasets() -> None:
    """Skip where `datasets` is absent (a bare GPU image): the data module needs it, and
    scripts/gpu_check.py runs the same GPU checks on the text files without it."""
    pytest.importorskip("datasets", reason="the data module needs datasets")
