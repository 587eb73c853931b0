"""User mistakes get one-line messages: config-group choices, run directories that already
hold a run, too many devices. And training is deterministic: same seed and data, same losses."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_utils import REPO, compose_train, tiny_overrides, write_toy_corpus

from litmt.cli.script.config_check import (
    check_command_line,
    check_devices,
    check_group_overrides,
    check_run_dir,
    expand_short_overrides,
    group_options,
)
from litmt.errors import ConfigError

CONF = REPO / "conf"
SCRIPTS = ("train.py", "evaluate.py", "translate.py", "score.py")


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# -- the one-line contract when Hydra wraps our errors -------------------------------------


def test_a_user_error_wrapped_by_hydra_instantiate_is_one_line_exit_2(capsys):
    import hydra
    from omegaconf import OmegaConf

    from litmt.cli.script.exits import cli_errors

    cfg = OmegaConf.create(
        {"_target_": "litmt.models.TransformerConfig", "src_vocab_size": 64, "positional": "alibi"}
    )
    with pytest.raises(SystemExit) as exit_info, cli_errors():
        hydra.utils.instantiate(cfg)  # raises InstantiationException from ConfigError
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: unknown positional encoding 'alibi'; valid names: sinusoidal, sinusoidal_split, learned, rope\n"
    )
    bug = OmegaConf.create({"_target_": "math.sqrt", "_args_": ["not a number"]})
    with pytest.raises(Exception, match=r"Error in call to target 'math\.sqrt'"), cli_errors():
        hydra.utils.instantiate(bug)  # a bug keeps its exception (and traceback)


# -- unknown config-group options (case 4) ---------------------------------------------------


def test_group_options_are_the_yaml_files():
    assert group_options("attention", CONF) == [
        "auto", "flash", "flex", "linear", "local", "math", "sdpa", "sparse", "te", "xformers"
    ]  # fmt: skip
    assert "tiny" in group_options("model", CONF)


def test_an_unknown_group_option_lists_the_valid_names():
    with pytest.raises(ConfigError) as exc:
        check_group_overrides(["model=tiny", "attention=nope"], CONF)
    assert one_line(exc) == (
        "unknown attention 'nope'; valid options: auto, flash, flex, linear, local, math, sdpa, "
        "sparse, te, xformers (the files in conf/attention/)"
    )
    with pytest.raises(ConfigError, match=r"unknown model 'huge'; valid options: base, big, small"):
        check_group_overrides(["model=huge"], CONF)
    with pytest.raises(ConfigError, match=r"unknown experiment 'wmt'; valid options: iwslt"):
        check_group_overrides(["+experiment=wmt"], CONF)
    with pytest.raises(ConfigError, match=r"unknown attention 'flsh'"):
        check_group_overrides(["-m", "attention=math,flsh"], CONF)  # a multirun sweep


def test_the_short_form_of_decoding_keys_is_spelled_out():
    """beam_size=5 means decoding.beam_size=5 in the commands that compose conf/decoding/."""
    args = ["ckpt_path=m.ckpt", "beam_size=5", "++n_best=2", "decoding.min_len=1", "-m", "seed=3"]
    assert expand_short_overrides(args, "translate", CONF) == [
        "ckpt_path=m.ckpt", "decoding.beam_size=5", "++decoding.n_best=2", "decoding.min_len=1",
        "-m", "decoding.seed=3",
    ]  # fmt: skip
    # evaluate's own seed (the data seed) stays top-level; train has no decoding group
    assert expand_short_overrides(["seed=3", "beam_size=2"], "evaluate", CONF) == [
        "seed=3",
        "decoding.beam_size=2",
    ]
    assert expand_short_overrides(["beam_size=2"], "train", CONF) == ["beam_size=2"]


def test_decoding_group_holds_every_decode_config_field_at_its_default():
    """conf/decoding/default.yaml: the DecodeConfig fields, each at the dataclass's default."""
    import dataclasses

    from omegaconf import OmegaConf

    from litmt.decoding.config import DecodeConfig

    group = OmegaConf.to_container(OmegaConf.load(CONF / "decoding" / "default.yaml"))
    assert group == dataclasses.asdict(DecodeConfig())


def test_valid_choices_and_other_overrides_pass():
    check_group_overrides(
        [
            "-m",
            "attention=math,sdpa",
            "model=tiny",
            "debug=null",
            "experiment=multi30k_cpu",
            "model.positional=alibi",  # a value, not a group choice (the model config checks it)
            "trainer.devices=2",
            "hydra.run.dir=x",
            "hydra/launcher=basic",
            "logger=[csv,tensorboard]",
            "attention=choice(math,sdpa)",  # sweep functions are left to Hydra
            "ckpt_path=model.ckpt",
        ],
        CONF,
    )


def test_check_command_line_prints_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_command_line(["attention=nope"], CONF)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: unknown attention 'nope'; valid options: auto, flash, flex, linear, local, math, "
        "sdpa, sparse, te, xformers (the files in conf/attention/)\n"
    )
    check_command_line(["attention=math"], CONF)  # no exit


def test_a_moved_key_names_its_new_spelling_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_command_line(["model=tiny", "model.compile=true"], CONF)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: model.compile moved to module.compile: pass module.compile=true\n"
    )
    for arg, want in (
        ("callbacks.scorer.beam_size=4", "pass callbacks.bleu.beam_size=4"),
        ("+callbacks.scorer.quality=[1]", "pass callbacks.bleu.quality=[1]"),
        ("callbacks.scorer=null", "pass callbacks.bleu=null"),
    ):
        with pytest.raises(SystemExit):
            check_command_line([arg], CONF)
        assert (
            capsys.readouterr().err == f"error: callbacks.scorer moved to callbacks.bleu: {want}\n"
        )
    check_command_line(["callbacks.bleu.beam_size=4", "callbacks.scorers=1"], CONF)  # no exit


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_report_an_unknown_group_option_in_one_line(script, tmp_path):
    group, bad = ("attention", "nope") if script == "train.py" else ("data", "nope")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), f"{group}={bad}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: unknown {group} '{bad}'; valid options: ")


# -- an output directory that already holds a run (case 11) ----------------------------------


def test_a_fresh_run_directory_starts_a_new_run(tmp_path):
    assert check_run_dir(tmp_path / "new") is None
    (tmp_path / "run" / ".hydra").mkdir(parents=True)  # Hydra writes these before we run
    (tmp_path / "run" / "train.log").write_text("")
    (tmp_path / "run" / "checkpoints").mkdir()  # empty: nothing to lose
    assert check_run_dir(tmp_path / "run") is None


def test_a_run_directory_with_last_ckpt_is_resumed(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("")
    assert check_run_dir(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    os.utime(tmp_path / "checkpoints" / "last.ckpt", (1, 1))  # older than the requeue file
    (tmp_path / "hpc_ckpt_2.ckpt").write_bytes(b"x")  # Lightning's SLURM requeue checkpoint
    assert check_run_dir(tmp_path) == tmp_path / "hpc_ckpt_2.ckpt"


def test_a_run_directory_without_last_ckpt_is_refused_not_overwritten(tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best-step000100-bleu30.00.ckpt").write_bytes(b"x")
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step\n")
    with pytest.raises(ConfigError) as exc:
        check_run_dir(tmp_path)
    assert one_line(exc) == (
        f"run directory {tmp_path} already holds a run (checkpoints/, csv/) but no "
        "checkpoints/last.ckpt to resume from; choose a new directory with hydra.run.dir=PATH, "
        "resume with ckpt_path=PATH, or pass overwrite=true to delete it and start over"
    )
    assert (tmp_path / "checkpoints" / "best-step000100-bleu30.00.ckpt").exists()
    assert check_run_dir(tmp_path, ckpt_path="other.ckpt") is None  # an explicit resume
    monkeypatch.setenv("LOCAL_RANK", "1")  # other DDP ranks share rank 0's directory
    assert check_run_dir(tmp_path) is None
    monkeypatch.delenv("LOCAL_RANK")
    inside = tmp_path / "checkpoints" / "best-step000100-bleu30.00.ckpt"
    with pytest.raises(ConfigError, match="overwrite=true would delete ckpt_path="):
        check_run_dir(tmp_path, ckpt_path=str(inside), overwrite=True)
    assert inside.exists()
    assert check_run_dir(tmp_path, overwrite=True) is None  # explicit: old outputs deleted
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "csv").exists()
    assert check_run_dir(tmp_path) is None


# -- trainer.devices larger than what exists (case 12) -------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "devices", "cuda", "cpus", "message"),
    [
        ("cpu", 64, 0, 2, "trainer.devices=64 with trainer.accelerator=cpu starts one process "
         "per device, but this machine has 2 CPU core(s); lower trainer.devices to at most 2"),
        ("auto", 4, 0, 16, "trainer.devices=4 but this machine has no CUDA GPU, so it would "
         "start 4 CPU processes; use trainer.devices=1, or trainer.accelerator=cpu to train "
         "with several CPU processes on purpose"),
        ("gpu", 2, 1, 16, "trainer.devices=2 but this machine has 1 CUDA GPU(s); lower "
         "trainer.devices, or train on the CPU with trainer=cpu"),
    ],
)  # fmt: skip
def test_more_devices_than_the_machine_has_is_refused(accelerator, devices, cuda, cpus, message):
    with pytest.raises(ConfigError) as exc:
        check_devices(accelerator, devices, cuda_count=cuda, cpu_count=cpus)
    assert one_line(exc) == message


def test_device_lists_and_zero_devices_are_refused():
    with pytest.raises(ConfigError, match=r"trainer.devices=\[0, 1, 2\] but this machine has 2"):
        check_devices("auto", [0, 1, 2], cuda_count=2, cpu_count=16)
    with pytest.raises(ConfigError, match=r"trainer.devices=0 selects no device"):
        check_devices("cpu", 0, cuda_count=0, cpu_count=2)


def test_devices_the_machine_has_are_accepted():
    check_devices("auto", 1, cuda_count=0, cpu_count=2)
    check_devices("cpu", 2, cuda_count=0, cpu_count=2)
    check_devices("gpu", "0,1", cuda_count=2, cpu_count=2)
    check_devices("auto", "auto", cuda_count=0, cpu_count=2)
    check_devices("auto", -1, cuda_count=0, cpu_count=2)
    check_devices("tpu", 8, cuda_count=0, cpu_count=2)  # Lightning reports other accelerators
    check_devices("cpu", 2)  # this machine's real counts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("accelerator", "devices", "message"),
    [
        ("cpu", 64, "error: trainer.devices=64 with trainer.accelerator=cpu starts one process"),
        ("auto", 4, "error: trainer.devices=4 but this machine has no CUDA GPU"),
    ],
)
def test_train_script_refuses_too_many_devices(accelerator, devices, message, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the messages are for a machine without CUDA")
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 30, "valid": 5, "test": 5})
    cmd = [
        sys.executable,
        "scripts/train.py",
        *tiny_overrides(corpus, tmp_path),
        f"trainer.accelerator={accelerator}",
        f"trainer.devices={devices}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in proc.stderr


# -- determinism -------------------------------------------------------------------------------


def _train_losses(corpus: Path, out: Path, steps: int) -> list[float]:
    from litmt.cli.train import train

    cfg = compose_train(
        [
            *tiny_overrides(corpus, out),
            f"trainer.max_steps={steps}",
            "trainer.log_every_n_steps=1",
            "trainer.limit_val_batches=0",
            "callbacks=none",
            "test_after_training=false",
            "module.optimizer.lr=3e-3",
            "module.scheduler.warmup_steps=10",
        ],
        out,
    )
    train(cfg)
    with open(next((out / "run" / "csv").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


def test_same_seed_and_data_give_identical_losses_for_50_steps(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 400, "valid": 10, "test": 10})
    first = _train_losses(corpus, tmp_path / "a", steps=50)
    second = _train_losses(corpus, tmp_path / "b", steps=50)  # own tokenizer and data caches
    assert len(first) == 50
    assert first == second  # exact equality, step by step
    assert first[-1] < first[0]  # it did train


def test_a_different_seed_gives_different_losses(tmp_path):
    """Control for the test above: the comparison can fail."""
    from litmt.cli.train import train

    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 100, "valid": 5, "test": 5})
    losses = []
    for seed, out in ((1, tmp_path / "a"), (2, tmp_path / "b")):
        cfg = compose_train(
            [
                *tiny_overrides(corpus, out),
                f"seed={seed}",
                "trainer.max_steps=3",
                "trainer.log_every_n_steps=1",
                "trainer.limit_val_batches=0",
                "callbacks=none",
                "test_after_training=false",
            ],
            out,
        )
        train(cfg)
        with open(next((out / "run" / "csv").rglob("metrics.csv"))) as f:
            losses.append([r["train/loss"] for r in csv.DictReader(f) if r.get("train/loss")])
    assert losses[0] != losses[1]


# -- the training entry point (cases 7 and 11 end to end, once litmt.cli.train calls the checks) ---


def _wired(name: str) -> None:
    assert name in (REPO / "src" / "litmt" / "cli" / "train.py").read_text(), (
        f"litmt.cli.train must call {name}"
    )


def _one_epoch(corpus: Path, out: Path, *extra: str):
    cfg = compose_train(
        [*tiny_overrides(corpus, out), "trainer.max_epochs=1", "test_after_training=false", *extra],
        out,
    )
    from litmt.cli.train import train

    return train(cfg)


def test_resuming_with_another_model_config_is_refused_in_one_line(tmp_path):
    _wired("check_compatible")
    from litmt.errors import CheckpointError

    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 60, "valid": 5, "test": 5})
    last = _one_epoch(corpus, tmp_path)["last_checkpoint"]
    assert last and Path(last).is_file()
    with pytest.raises(CheckpointError) as exc:
        _one_epoch(corpus, tmp_path, "model.d_ff=96")
    assert one_line(exc).startswith(f"{last} was trained with another model config (model.d_ff=")
    assert "96 requested); use the settings it was trained with" in one_line(exc)


def test_training_into_a_directory_that_holds_a_run_without_last_ckpt_is_refused(tmp_path):
    _wired("check_run_dir")
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 60, "valid": 5, "test": 5})
    last = Path(_one_epoch(corpus, tmp_path)["last_checkpoint"])
    last.unlink()
    kept = sorted(p.name for p in last.parent.iterdir())
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints/, csv/\)"):
        _one_epoch(corpus, tmp_path)
    assert sorted(p.name for p in last.parent.iterdir()) == kept  # nothing overwritten


# -- a CUDA-only backend on a CPU machine (case 5, the package being installed) ---------------


def test_a_cuda_only_backend_with_its_package_installed_refuses_the_cpu(monkeypatch):
    import types

    from litmt.errors import BackendError
    from litmt.models import Seq2SeqTransformer, TransformerConfig

    stand_in = types.ModuleType("flash_attn")  # import succeeds; the kernels are never called
    stand_in.flash_attn_func = stand_in.flash_attn_varlen_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn", stand_in)
    flash = {"encoder_self": "flash", "decoder_self": "flash", "cross": "flash"}
    model = Seq2SeqTransformer(
        TransformerConfig(src_vocab_size=16, d_model=16, n_heads=2, d_ff=32, attention=flash)
    )
    with pytest.raises(BackendError) as exc:
        model.validate_backends("cpu")
    assert one_line(exc) == (
        "attention backend 'flash' (at encoder_self) runs only on cuda, not on 'cpu'; "
        "choose attention=sdpa or attention=math there"
    )
