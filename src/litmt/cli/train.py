"""`train(cfg)`: compose data, model, trainer and loggers from a Hydra config and fit."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from litmt.checkpoint.compat import check_compatible
from litmt.checkpoint.io import atomic_save, load_checkpoint
from litmt.cli.finalize import run_finalize
from litmt.cli.script.config_check import check_devices, check_run_dir, script_conf_dir
from litmt.errors import ConfigError, LitmtError
from litmt.runtime.distributed import release_process_group
from litmt.runtime.fp8 import fp8_precision_plugin, pad_multiple_for
from litmt.runtime.precision import configure_precision, is_fp8
from litmt.runtime.threads import usable_cores
from litmt.training.finalize import check_finalize_config, flat_metrics
from litmt.training.finetune import model_config_for, prepare_model, setup_init_from

log = logging.getLogger(__name__)

EXIT_SIGTERM = 128 + signal.SIGTERM  # the status of a process killed by SIGTERM (143)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO that writes to a temporary file and renames it into place."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        atomic_save(checkpoint, path)


def _instantiate_dict(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every `_target_` entry of a group like `callbacks` or `logger`."""
    if not cfg:
        return []
    return [hydra.utils.instantiate(c) for c in cfg.values() if c is not None and "_target_" in c]


def model_config_dict(cfg: DictConfig, tokenizer: Any) -> dict[str, Any]:
    """The `TransformerConfig` kwargs: `cfg.model`, with the vocab sizes from the tokenizer."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(model, dict)
    model["src_vocab_size"] = tokenizer.src_vocab_size
    model["tgt_vocab_size"] = tokenizer.tgt_vocab_size
    if not tokenizer.joint and model.get("share_embeddings", True):
        log.info("separate vocabularies: turning off model.share_embeddings")
        model["share_embeddings"] = False
    return model


def resume_path(cfg: DictConfig, output_dir: Path) -> str | None:
    """`cfg.ckpt_path`, else the newest of `<run dir>/checkpoints/last.ckpt` and Lightning's
    SLURM requeue checkpoints `<run dir>/hpc_ckpt_*.ckpt`, when the run directory has one."""
    if cfg.get("ckpt_path"):
        path = Path(cfg.ckpt_path)
        if not path.is_file():
            raise LitmtError(
                f"ckpt_path={cfg.ckpt_path} does not exist; pass a .ckpt file to resume from"
            )
        return str(path)
    found = [output_dir / "checkpoints" / "last.ckpt", *output_dir.glob("hpc_ckpt_*.ckpt")]
    found = [p for p in found if p.is_file()]
    if not found:
        return None
    return str(max(found, key=lambda p: p.stat().st_mtime_ns))  # this run dir holds a run


def check_precision(precision: Any) -> None:
    """Fail early, in one line, on FP8 without Transformer Engine (Lightning raises an import
    error with a traceback)."""
    if str(precision).startswith("transformer-engine"):
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is None:
            raise ConfigError(
                f"trainer.precision={precision} (FP8) needs NVIDIA Transformer Engine on a CUDA "
                "GPU: pip install 'litmt[te]', or use trainer.precision=bf16-mixed"
            )


def trainer_precision(cfg: DictConfig) -> str | int:
    """`trainer.precision` resolved for this machine, checked, logged in one line: `auto` →
    bf16-mixed / 16-mixed on CUDA, 32-true elsewhere (`litmt.runtime.precision`)."""
    precision = configure_precision(
        cfg.trainer.get("precision"), cfg.trainer.get("accelerator", "auto")
    )
    check_precision(precision)
    return precision


def build_trainer(
    cfg: DictConfig,
    callbacks: list[Any],
    loggers: list[Any],
    precision: str | int | None = None,
) -> L.Trainer:
    """Instantiate the Lightning Trainer; device/config mistakes become one-line `LitmtError`s.

    Args:
        precision: `trainer_precision(cfg)` when the caller has it already (None: resolve it).
    """
    accel, devices = cfg.trainer.get("accelerator", "auto"), cfg.trainer.get("devices", 1)
    if precision is None:
        precision = trainer_precision(cfg)
    check_devices(accel, devices)
    plugins: list[Any] = [AtomicCheckpointIO()]
    if is_fp8(precision):
        # Lightning's plugin for the same string, except that tied weights stay tied; a
        # plugin and a precision flag together are refused by Lightning, hence precision=None
        plugins.append(fp8_precision_plugin(str(precision)))
        precision = None
    try:
        return hydra.utils.instantiate(
            cfg.trainer,
            callbacks=callbacks,
            logger=loggers or False,
            plugins=plugins,
            precision=precision,
        )
    except (MisconfigurationException, InstantiationException) as exc:
        cause = exc.__cause__ if isinstance(exc, InstantiationException) else exc
        if not isinstance(cause, MisconfigurationException | ValueError | RuntimeError):
            raise
        raise ConfigError(f"invalid trainer settings: {str(cause).splitlines()[0]}") from exc


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train a translator as configured; returns the final metrics (and checkpoint paths).

    A DDP rank leaves its process group on the way out, whether the run ended or failed
    (`release_process_group`: Lightning does that at exit for NCCL only)."""
    try:
        return _train(cfg)
    finally:
        release_process_group()


def _train(cfg: DictConfig) -> dict[str, Any]:
    """The run's fixed phases: start, data, model, trainer, resume, fit, test and finalize."""
    output_dir = start_run(cfg)
    datamodule, init, precision = setup_data(cfg)
    module = build_module(cfg, datamodule, init)
    del init
    callbacks = _instantiate_dict(cfg.get("callbacks"))  # conf/callbacks: every one of them
    loggers = _instantiate_dict(cfg.get("logger"))
    for lg in loggers:
        if hasattr(lg, "log_hyperparams"):
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    trainer = build_trainer(cfg, callbacks, loggers, precision)
    ckpt = check_resume(cfg, output_dir, module, datamodule)
    weights_only = bool(cfg.get("weights_only_load", True))
    fit(trainer, module, datamodule, ckpt, weights_only, output_dir)
    metrics: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best, last, kept = saved_checkpoints(trainer)
    if cfg.get("test_after_training") and not trainer.interrupted:
        results = trainer.test(
            module, datamodule=datamodule, ckpt_path=best or None, weights_only=weights_only
        )
        metrics.update({k: float(v) for k, v in (results[0] if results else {}).items()})
        if best and trainer.is_global_zero and cfg.get("finalize"):
            report = run_finalize(cfg.finalize, datamodule, kept, best, output_dir)
            metrics.update(flat_metrics(report))
    metrics["best_checkpoint"] = best
    metrics["last_checkpoint"] = last
    metrics["output_dir"] = str(output_dir)
    if trainer.is_global_zero:
        print_summary(metrics)
    return metrics


def start_run(cfg: DictConfig) -> Path:
    """Seed, create the run directory and check it and the finalize block; returns the
    directory. A directory holding a run that cannot be resumed is refused (or, with
    overwrite=true, cleared); resuming itself is decided by `resume_path`, which every rank
    computes identically."""
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    check_run_dir(
        output_dir, ckpt_path=cfg.get("ckpt_path"), overwrite=bool(cfg.get("overwrite", False))
    )
    check_finalize_config(cfg)  # fail now, not after the training hour
    if advice := cpu_advice(cfg, torch.cuda.is_available()):
        log.warning(advice)
    return output_dir


CPU_RECIPE = "multi30k_cpu"  # conf/experiment/: the recipe sized for a few CPU cores


def cpu_advice(cfg: DictConfig, cuda: bool) -> str | None:
    """One line for a run that trains on the CPU with no time limit (the default command on a
    machine without a GPU): how long it may take, and the recipe that fits a CPU. None when a
    GPU trains, ``trainer.max_time`` caps the run, or it is a debug run."""
    trainer = cfg.get("trainer") or {}
    accelerator = str(trainer.get("accelerator", "auto"))
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not cuda)
    if not on_cpu or trainer.get("max_time") or trainer.get("fast_dev_run"):
        return None
    if trainer.get("limit_train_batches") or int(trainer.get("max_steps", -1) or -1) > 0:
        return None
    model = cfg.get("model") or {}
    recipe = script_conf_dir() / "experiment" / f"{CPU_RECIPE}.yaml"
    budget = OmegaConf.load(recipe).get("trainer", {}).get("max_time") if recipe.is_file() else None
    length = ""
    if budget:
        days, hours, minutes, _ = (int(x) for x in str(budget).split(":"))
        length = f" ({(days * 24 + hours) * 60 + minutes} minutes of training)"
    return (
        f"training on the CPU ({usable_cores()} cores) with no trainer.max_time: up to "
        f"{trainer.get('max_epochs')} epochs of a d_model={model.get('d_model')} model, hours "
        f"or days here (the estimate follows after the first steps). The recipe that fits a "
        f"CPU: python scripts/train.py experiment={CPU_RECIPE} data.dir=DIR{length}; or cap "
        f"this run with trainer.max_time=00:01:00:00"
    )


def setup_data(cfg: DictConfig) -> tuple[L.LightningDataModule, Any, str | int]:
    """The prepared datamodule (set up for fit), the `init_from` source and the precision.

    Launchers like torchrun/SLURM start every rank at once: one process per node (or per job,
    data.prepare_data_per_node=false) trains the tokenizer and tokenises; the others wait for
    it, then every rank reads the caches.
    """
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    init = setup_init_from(cfg, datamodule)  # init_from: its weights come later, its tokenizer now
    precision = trainer_precision(cfg)  # resolved once, for the data padding and the trainer
    multiple = pad_multiple_for(precision, datamodule.pad_to_multiple)
    if multiple != datamodule.pad_to_multiple:
        log.info("FP8: batch lengths padded to multiples of %d", multiple)
        datamodule.pad_to_multiple = multiple
    datamodule.prepare_once()
    datamodule.setup("fit")
    return datamodule, init, precision


def build_module(cfg: DictConfig, datamodule: Any, init: Any) -> L.LightningModule:
    """The LightningModule (`cfg.module`) for the datamodule's tokenizer and languages, with
    the `init_from` weights and `finetune.freeze` applied."""
    tokenizer = datamodule.tokenizer
    module = hydra.utils.instantiate(
        cfg.module,
        model_config=model_config_for(cfg, init, model_config_dict(cfg, tokenizer)),
        tokenizer=tokenizer,
        src_lang=datamodule.src_lang,
        tgt_lang=datamodule.tgt_lang,
        seed=cfg.seed,
        languages=datamodule.languages_meta() if hasattr(datamodule, "languages_meta") else None,
    )
    prepare_model(module.model, init, cfg)  # init_from weights, finetune.freeze
    log.info("model: %.2fM parameters", module.model.num_parameters() / 1e6)
    return module


def check_resume(cfg: DictConfig, output_dir: Path, module: Any, datamodule: Any) -> str | None:
    """The checkpoint to resume from (`resume_path`), checked against this run's model,
    tokenizer and languages now, with a clear message, rather than deep inside Lightning."""
    ckpt = resume_path(cfg, output_dir)
    if ckpt is None:
        return None
    state = load_checkpoint(ckpt)  # fails early, with a clear message, on a corrupt file
    check_compatible(
        state,
        module.model.config,
        datamodule.tokenizer,
        path=ckpt,
        src_lang=datamodule.src_lang,
        tgt_lang=datamodule.tgt_lang,
    )
    log.info("resuming from %s at global step %s", ckpt, state.get("global_step"))
    return ckpt


def fit(
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    ckpt: str | None,
    weights_only: bool,
    output_dir: Path,
) -> None:
    """`trainer.fit`; a SIGTERM (callbacks.preemption saved last.ckpt) exits like a process
    killed by SIGTERM would, with the line that says how to resume."""
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt, weights_only=weights_only)
    except SIGTERMException:
        if trainer.is_global_zero:
            print(
                f"stopped by SIGTERM at step {trainer.global_step}; resume with the same "
                f"command and hydra.run.dir={output_dir}",
                file=sys.stderr,
                flush=True,
            )
        raise SystemExit(EXIT_SIGTERM) from None


def saved_checkpoints(trainer: L.Trainer) -> tuple[str | None, str | None, dict[str, Any]]:
    """(best, last, the kept top-k {path: score}) of the trainer's `ModelCheckpoint`.

    The top-k is copied now: ``trainer.test(ckpt_path=best)`` restores the callbacks' state
    from `best`, whose ``best_k_models`` is the top-k as it stood when `best` was saved
    (files since deleted).
    """
    checkpoint_cb = trainer.checkpoint_callback
    best = getattr(checkpoint_cb, "best_model_path", "") or None
    last = getattr(checkpoint_cb, "last_model_path", "") or None
    best = best if best and Path(best).is_file() else None
    last = last if last and Path(last).is_file() else None
    return best, last, dict(getattr(checkpoint_cb, "best_k_models", {}))


def print_summary(metrics: dict[str, Any]) -> None:
    """The run's last lines on stdout: its directory, checkpoints and test scores."""
    print(f"run directory: {metrics['output_dir']}")
    if metrics["best_checkpoint"]:
        print(f"best checkpoint: {metrics['best_checkpoint']}")
    if metrics["last_checkpoint"]:
        print(f"last checkpoint: {metrics['last_checkpoint']}")
    for key in ("test/bleu", "test/chrf", "test/loss"):
        if key in metrics:
            print(f"{key}: {metrics[key]:.2f}")
