"""Training: a tiny model learns, every experiment composes, the script runs, checkpoints reload."""

from __future__ import annotations

import csv
import functools
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import hydra
import lightning as L
import lightning.pytorch.callbacks.timer as lightning_timer
import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Timer
from PIL import Image
from tiny_model import tiny_config
from train_utils import (
    REPO,
    compose_train,
    lr_schedule,
    run_train_script,
    tiny_overrides,
    write_toy_corpus,
)

from litmt.checkpoint.io import load_checkpoint
from litmt.cli.train import train
from litmt.errors import ConfigError
from litmt.training.losses import label_smoothed_nll
from litmt.training.module import TranslationModule
from litmt.training.schedules import lr_lambda

EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def test_label_smoothed_loss_matches_torch_cross_entropy():
    logits, target = torch.randn(12, 9), torch.randint(0, 9, (12,))
    target[3] = 0  # padding
    loss, nll, n = label_smoothed_nll(logits, target, 0.1, ignore_index=0)
    ref = torch.nn.functional.cross_entropy(
        logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    torch.testing.assert_close(loss, ref)
    assert n == 11
    torch.testing.assert_close(
        nll, torch.nn.functional.cross_entropy(logits, target, ignore_index=0, reduction="sum")
    )


def test_schedules_warm_up_then_decay():
    inv = lr_lambda("inverse_sqrt", 100, None)
    assert inv(0) == pytest.approx(0.01) and inv(99) == pytest.approx(1.0)
    assert inv(399) == pytest.approx(0.5)
    cos = lr_lambda("cosine", 10, 110, min_lr_ratio=0.1)
    assert cos(9) == pytest.approx(1.0) and cos(109) == pytest.approx(0.1)


def test_cosine_on_the_clock_follows_the_time_fraction_not_the_step():
    clock = {"p": 0.0}
    fn = lr_lambda("cosine", 10, None, min_lr_ratio=0.1, time_progress=lambda: clock["p"])
    assert fn(4) == pytest.approx(0.5)  # warmup ramp while the clock has barely moved
    clock["p"] = 0.5
    assert fn(4) == pytest.approx(0.5) and fn(1000) == pytest.approx(0.55)  # 0.1 + 0.9 * 0.5
    clock["p"] = 1.0
    assert fn(20) == pytest.approx(0.1) and fn(100_000) == pytest.approx(0.1)
    clock["p"] = 1.7  # a run past its budget (final validation) stays at the floor
    assert fn(20) == pytest.approx(0.1)


def test_cosine_on_the_clock_after_a_resume_decays_over_the_whole_budget(monkeypatch):
    """A run resumed with 600 s of its 1000 s trainer.max_time spent: Lightning's Timer restores
    the elapsed time (before configure_optimizers, as Trainer._run does) and keeps counting on
    a fake clock. The decay horizon stays the whole 1000 s, not the 400 s left."""
    clock = {"now": 5000.0}
    monkeypatch.setattr(lightning_timer, "time", SimpleNamespace(monotonic=lambda: clock["now"]))
    trainer = L.Trainer(
        max_time={"seconds": 1000},
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
    timer.load_state_dict({"time_elapsed": {"train": 600.0, "validate": 40.0}})  # from last.ckpt
    module = TranslationModule(
        tiny_config(),
        tokenizer=None,  # type: ignore[arg-type]  # not needed: no decoding
        src_lang="en",
        tgt_lang="de",
        scheduler=lr_schedule(name="cosine", warmup_steps=10, min_lr_ratio=0.1, horizon="time"),
        optimizer=functools.partial(torch.optim.AdamW, lr=1.0),
    )
    module.trainer = trainer
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    timer.on_train_start(trainer, module)  # the clock restarts from the restored 600 s
    fn = scheduler.lr_lambdas[0]

    def cosine(fraction: float) -> float:
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction))

    for spent, fraction in ((0, 0.6), (100, 0.7), (250, 0.85), (400, 1.0)):
        clock["now"] = 5000.0 + spent
        assert fn(50_000) == pytest.approx(cosine(fraction)), f"at {600 + spent} s of 1000 s"
    assert fn(3) == pytest.approx(0.1)  # the warmup ramp (0.4) never lifts it off the floor


def _lr_of_a_run(tmp_path, extra):
    corpus = write_toy_corpus(tmp_path / "corpus")
    cfg = compose_train(
        [
            *tiny_overrides(corpus, tmp_path),
            "module.scheduler.name=cosine",
            "module.scheduler.warmup_steps=2",
            "module.scheduler.min_lr_ratio=0.0",
            "test_after_training=false",
            "trainer.limit_val_batches=0",
            *extra,
        ],
        tmp_path,
    )
    train(cfg)
    with open(next((tmp_path / "run" / "csv").rglob("metrics.csv"))) as f:
        return [float(r["lr"]) for r in csv.DictReader(f) if r.get("lr")]


def test_cosine_with_the_time_horizon_decays_over_trainer_max_time(tmp_path, caplog):
    # max_epochs 1000 would make the step horizon ~huge; max_time (2 s) ends the run, and the
    # LR must have reached ~0 by then, through Lightning's own Timer
    with caplog.at_level("INFO", logger="litmt.training.schedules"):
        lrs = _lr_of_a_run(
            tmp_path,
            [
                "module.scheduler.horizon=time",
                "trainer.max_epochs=1000",
                "trainer.max_time=00:00:00:02",
                "trainer.log_every_n_steps=1",
            ],
        )
    assert "follows the time budget" in caplog.text
    assert len(lrs) > 5
    assert lrs[-1] < 0.1 * max(lrs), f"LR did not decay to the time budget: {lrs[-5:]}"


def test_the_time_horizon_without_max_time_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^module\.scheduler\.horizon=time decays the LR over "
                       r"trainer\.max_time, which is not set; set trainer\.max_time="):  # fmt: skip
        _lr_of_a_run(tmp_path, ["module.scheduler.horizon=time", "trainer.max_steps=3"])


def test_cosine_with_max_steps_keeps_the_step_horizon(tmp_path, caplog):
    with caplog.at_level("INFO", logger="litmt.training.schedules"):
        lrs = _lr_of_a_run(
            tmp_path,
            ["trainer.max_steps=12", "trainer.max_time=00:00:05:00", "trainer.log_every_n_steps=1"],
        )
    assert "follows the time budget" not in caplog.text
    ref = lr_lambda("cosine", 2, 12)
    peak = max(lrs) / ref(1)
    assert lrs[-1] == pytest.approx(peak * ref(len(lrs) - 1), rel=1e-4)


def test_tiny_model_learns_the_toy_task(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    cfg = compose_train(
        [
            *tiny_overrides(corpus, tmp_path),
            "trainer.max_epochs=40",
            "module.optimizer.lr=3e-3",
            "module.scheduler.warmup_steps=30",
            "trainer.check_val_every_n_epoch=40",
            "test_after_training=false",
        ],
        tmp_path,
    )
    metrics = train(cfg)
    with open(next((tmp_path / "run" / "csv").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall: {losses[0]:.2f} -> {losses[-1]:.2f}"
    assert metrics["valid/bleu"] > 40, f"validation BLEU only {metrics['valid/bleu']:.1f}"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_instantiates(experiment, tmp_path):
    cfg = compose_train([f"experiment={experiment}"], tmp_path)
    dm = hydra.utils.instantiate(cfg.data)
    assert dm.src_lang and dm.tgt_lang
    model_cfg = dict(cfg.model)  # every key of the `model` group is a TransformerConfig field
    model_cfg.update(src_vocab_size=1000, tgt_vocab_size=1000, attention=dict(cfg.model.attention))
    from litmt.models import TransformerConfig

    TransformerConfig.from_dict(model_cfg)  # validates
    for group in ("callbacks", "logger"):
        for c in (cfg.get(group) or {}).values():
            if c is not None and "_target_" in c and "Wandb" not in c._target_:
                hydra.utils.instantiate(c)
    opt = hydra.utils.instantiate(cfg.module.optimizer)
    assert callable(opt)


def test_checkpoint_reloads_with_the_same_validation_loss(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 200, "valid": 30, "test": 30})
    cfg = compose_train(
        [*tiny_overrides(corpus, tmp_path), "trainer.max_epochs=3", "test_after_training=false"],
        tmp_path,
    )
    metrics = train(cfg)
    ckpt_path = metrics["last_checkpoint"]
    ckpt = load_checkpoint(ckpt_path)  # weights_only=True
    assert ckpt["litmt"]["src_lang"] == "en" and isinstance(
        ckpt["litmt"]["tokenizer"]["src_model"], bytes
    )

    import lightning as L

    dm = hydra.utils.instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("validate")
    module = TranslationModule(ckpt["litmt"]["model_config"], dm.tokenizer, "en", "de")
    module.load_state_dict(ckpt["state_dict"])
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    again = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert again["valid/loss"] == pytest.approx(metrics["valid/loss"], rel=1e-5)


def test_train_script_fast_dev_run_in_a_subprocess(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 100, "valid": 10, "test": 10})
    proc = run_train_script([*tiny_overrides(corpus, tmp_path), "debug=fast_dev_run"], 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run directory: {tmp_path / 'run'}" in proc.stdout


@pytest.mark.slow
def test_train_script_reports_a_bad_override_in_one_line(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 50, "valid": 5, "test": 5})
    overrides = [*tiny_overrides(corpus, tmp_path), "model.positional=alibi", "debug=fast_dev_run"]
    proc = run_train_script(overrides, 300)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: unknown positional encoding 'alibi'; valid names: sinusoidal, sinusoidal_split, learned, rope"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_multirun_over_attention_backends(tmp_path):
    """Each run of the sweep trains with its own backend: the model config saved in each run's
    checkpoint names the backend of that run's override, at every site."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 60, "valid": 6, "test": 6})
    over = [o for o in tiny_overrides(corpus, tmp_path) if not o.startswith("hydra.run.dir")]
    cmd = [
        sys.executable,
        "scripts/train.py",
        "-m",
        "attention=math,sdpa",
        *over,
        "trainer.max_epochs=1",
        "test_after_training=false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dirs = re.findall(r"^run directory: (.+)$", proc.stdout, re.M)
    assert sorted(run_dirs) == [str(tmp_path / "sweep" / n) for n in ("0", "1")]
    used = {}
    for run in map(Path, run_dirs):
        assert (
            run / "train.log"
        ).is_file()  # the job is named train, not after litmt.cli.script.runner
        (override,) = [
            o
            for o in yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
            if o.startswith("attention=")
        ]
        config = load_checkpoint(run / "checkpoints" / "last.ckpt")["litmt"]["model_config"]
        sites = {config["attention"][site] for site in ("encoder_self", "decoder_self", "cross")}
        used[override.removeprefix("attention=")] = sites
    assert used == {"math": {"math"}, "sdpa": {"sdpa"}}


def test_validation_logs_a_cross_attention_heatmap_to_offline_wandb(tmp_path, monkeypatch):
    """The default loggers, with no WANDB_* variable and the network out of reach (proxies and
    W&B's server at an unreachable address): W&B stays offline by the config's own default and
    the validation heatmap it stores is a drawn heatmap, not an empty image."""
    for name in [k for k in os.environ if k.upper().startswith("WANDB_")]:
        monkeypatch.delenv(name)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://192.0.2.1:9")  # RFC 5737: nothing answers there
    monkeypatch.setenv("WANDB_BASE_URL", "http://192.0.2.1:9")
    # the heatmap is drawn inside the precision plugin's forward_context (its autocast)
    import contextlib

    from lightning.pytorch.plugins.precision import Precision

    import litmt.decoding.analysis.attention_maps

    inside, drawn_inside = [], []
    plain_context, plain_figure = (
        Precision.forward_context,
        litmt.decoding.analysis.attention_maps.cross_attention_figure,
    )

    @contextlib.contextmanager
    def spy_context(self):
        inside.append(True)
        try:
            with plain_context(self):
                yield
        finally:
            inside.pop()

    def spy_figure(*args, **kwargs):
        drawn_inside.append(bool(inside))
        return plain_figure(*args, **kwargs)

    monkeypatch.setattr(Precision, "forward_context", spy_context)
    monkeypatch.setattr(
        litmt.decoding.analysis.attention_maps, "cross_attention_figure", spy_figure
    )
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 100, "valid": 10, "test": 10})
    over = [o for o in tiny_overrides(corpus, tmp_path) if o != "logger=csv"]  # default: W&B + CSV
    train(compose_train([*over, "trainer.max_epochs=1", "test_after_training=false"], tmp_path))
    wandb_dir = tmp_path / "run" / "wandb"
    assert list(wandb_dir.glob("offline-run-*")) and not list(wandb_dir.glob("run-*"))
    pngs = list(wandb_dir.rglob("media/images/valid/cross_attention_*.png"))
    assert len(pngs) == 1, "no heatmap image in the offline W&B run"
    assert drawn_inside == [True], drawn_inside
    with Image.open(pngs[0]) as img:
        rgb = np.asarray(img.convert("RGB"), dtype=np.int16)  # (height, width, 3)
    height, width, _ = rgb.shape
    assert 200 <= width <= 4000 and 150 <= height <= 4000, (width, height)
    assert rgb.std() > 20  # not one flat colour
    # the heatmap cells: coloured (not white/grey/black) pixels in many shades of the map
    colored = rgb[(rgb.max(axis=-1) - rgb.min(axis=-1)) > 40]  # (N, 3)
    assert len(colored) > 0.05 * width * height, "almost no coloured pixels: no heatmap drawn"
    _, counts = np.unique(colored, axis=0, return_counts=True)
    assert len(counts) >= 8 and counts.max() < 0.6 * counts.sum(), "one colour fills the map"


@pytest.mark.slow
def test_module_compile_trains_and_keeps_plain_checkpoint_keys(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 60, "valid": 6, "test": 6})
    cfg = compose_train(
        [
            *tiny_overrides(corpus, tmp_path),
            "module.compile=true",
            "trainer.max_steps=3",
            "test_after_training=false",
        ],
        tmp_path,
    )
    metrics = train(cfg)
    keys = load_checkpoint(metrics["last_checkpoint"])["state_dict"]
    assert keys and all(k.startswith("model.") and "_orig_mod" not in k for k in keys)


@pytest.mark.slow
def test_small_model_learns_real_multi30k(multi30k_dir, tmp_path):
    """400 steps of the CPU recipe on ../shared/data/multi30k: validation BLEU rises past 8."""
    cfg = compose_train(
        [
            "experiment=multi30k_cpu",
            f"data.dir={multi30k_dir}",
            f"data.cache_dir={tmp_path / 'data'}",
            "logger=csv",
            "trainer.max_steps=400",
            "trainer.max_time=null",
            "module.scheduler.horizon=steps",  # no time budget: decay over the estimated steps
            "trainer.val_check_interval=200",
            "trainer.check_val_every_n_epoch=null",
            "trainer.enable_progress_bar=false",
            "test_after_training=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    metrics = train(cfg)
    with open(next((tmp_path / "run" / "csv").rglob("metrics.csv"))) as f:
        bleu = [float(r["valid/bleu"]) for r in csv.DictReader(f) if r.get("valid/bleu")]
    assert len(bleu) == 2 and bleu[1] > bleu[0], f"validation BLEU did not rise: {bleu}"
    assert metrics["valid/bleu"] > 8, f"validation BLEU only {metrics['valid/bleu']:.1f}"
