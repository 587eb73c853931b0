"""Checks that run before or at the start of a job, so user mistakes get one-line messages.

- `check_command_line`: config-group choices on the command line (``attention=nope``) are
  checked against the files in ``conf/<group>/`` *before* Hydra composes the config (Hydra's
  own error is a multi-line report). Call it in a script just before ``main()``.
- `check_moved_keys`: a key that moved (``model.compile=true``) names its new spelling.
- `expand_short_overrides`: the short form ``beam_size=5`` of a decoding key becomes
  ``decoding.beam_size=5`` for the commands that compose the ``decoding`` group.
- `check_run_dir`: a run directory that already holds a run is resumed or refused, never
  silently overwritten.
- `check_devices`: ``trainer.devices`` larger than what the machine has.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from litmt.errors import ConfigError
from litmt.runtime.threads import usable_cores

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[4] / "conf"

# `group=value`, `+group=value`, `++group=value`, `group@pkg=value`: the key is a config group
# only when it has no dots (`model.d_model=...` is a value, not a group choice).
_GROUP_OVERRIDE = re.compile(r"^\+{0,2}(?P<group>[A-Za-z_][\w/]*)(?:@[\w.]+)?=(?P<value>.*)$")
# `key=value` or `++key=value` with a plain key (no dots): a candidate for the short form.
_SHORT_OVERRIDE = re.compile(r"^(?P<prefix>(?:\+\+)?)(?P<key>[A-Za-z_]\w*)(?P<rest>=.*)$")
# Config groups whose keys may be given without their group's name (`beam_size=5`).
SHORT_GROUPS = ("decoding",)
# Hydra sweep syntax we do not try to expand (choice(...), range(...), glob(...), quoted values).
_SWEEP_FUNCTION = re.compile(r"[()'\"{}*]")

# What a finished or running training leaves in its run directory (Hydra's own `.hydra/` and
# `<task>.log` are written before our code runs, so they do not count).
RUN_ARTIFACTS = ("checkpoints", "csv", "wandb", "tensorboard", "lightning_logs")


def group_options(group: str, conf_dir: str | Path = CONF_DIR) -> list[str]:
    """The names a config group accepts: the ``*.yaml`` stems of ``conf/<group>/``, sorted."""
    return sorted(p.stem for p in (Path(conf_dir) / group).glob("*.yaml"))


def check_group_overrides(overrides: Sequence[str], conf_dir: str | Path = CONF_DIR) -> None:
    """Raise `ConfigError` for a command-line choice of a config group that has no YAML file.

    Args:
        overrides: command-line arguments (flags such as ``-m`` are skipped).
        conf_dir: the Hydra config directory whose sub-directories are the groups.

    Raises:
        ConfigError: ``unknown attention 'nope'; valid options: auto, flash, ...``.
    """
    conf_dir = Path(conf_dir)
    for arg in overrides:
        match = _GROUP_OVERRIDE.match(arg)
        if match is None:
            continue
        group, value = match["group"], match["value"].strip()
        if group.startswith("hydra") or not (conf_dir / group).is_dir():
            continue
        if _SWEEP_FUNCTION.search(value):
            continue  # sweep functions and quoted values: left to Hydra
        valid = group_options(group, conf_dir)
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]  # a list of options of one group
        for choice in (v.strip() for v in value.split(",")):
            if choice in ("null", "") or choice in valid:
                continue
            raise ConfigError(
                f"unknown {group} '{choice}'; valid options: {', '.join(valid)} "
                f"(the files in conf/{group}/)"
            )


# Keys that moved: the spelling users typed before -> the one that replaced it.
MOVED_KEYS = {"model.compile": "module.compile", "callbacks.scorer": "callbacks.bleu"}


def check_moved_keys(overrides: Sequence[str]) -> None:
    """Raise `ConfigError` naming the new spelling of a key that moved (`MOVED_KEYS`).

    Raises:
        ConfigError: ``model.compile moved to module.compile: pass module.compile=true``;
            ``callbacks.scorer moved to callbacks.bleu: pass callbacks.bleu.beam_size=4``.
    """
    for arg in overrides:
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        for old, new in MOVED_KEYS.items():
            if key == old or key.startswith(old + "."):
                moved = new + key[len(old) :]
                raise ConfigError(f"{old} moved to {new}: pass {moved}={value}")


def check_command_line(
    argv: Sequence[str] | None = None, conf_dir: str | Path | None = None
) -> None:
    """`check_group_overrides` on ``sys.argv[1:]``; a mistake prints one line and exits 2.

    Call it right before the ``@hydra.main`` function runs (`litmt.cli.script.runner.run_script` does).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        conf_dir: the config directory (default: `script_conf_dir`).
    """
    from litmt.cli.script.exits import cli_errors

    with cli_errors():
        check_moved_keys(sys.argv[1:] if argv is None else argv)
        check_group_overrides(
            sys.argv[1:] if argv is None else argv,
            script_conf_dir() if conf_dir is None else conf_dir,
        )


def expand_short_overrides(
    overrides: Sequence[str], config_name: str, conf_dir: str | Path = CONF_DIR
) -> list[str]:
    """`overrides` with the short form of group keys spelled out: ``beam_size=5`` becomes
    ``decoding.beam_size=5`` when ``conf/<config_name>.yaml`` composes the ``decoding`` group.

    A key is expanded only when it is a key of the group's default file and not a top-level
    key of the command's own config (evaluate's ``seed`` stays the data seed). Anything else
    (dotted keys, ``+key``, flags) is passed on as it is.
    """
    from omegaconf import OmegaConf

    conf_dir = Path(conf_dir)
    primary = OmegaConf.to_container(OmegaConf.load(conf_dir / f"{config_name}.yaml"))
    assert isinstance(primary, dict)
    defaults = primary.pop("defaults", None) or []
    chosen = {
        group: str(option)
        for entry in defaults
        if isinstance(entry, dict)
        for group, option in entry.items()
        if group in SHORT_GROUPS and option is not None
    }
    short: dict[str, str] = {}
    for group, option in chosen.items():
        keys = OmegaConf.load(conf_dir / group / f"{option}.yaml").keys()
        short.update({str(key): group for key in keys if key not in primary})
    expanded = []
    for arg in overrides:
        match = _SHORT_OVERRIDE.match(arg)
        if match is not None and match["key"] in short:
            arg = f"{match['prefix']}{short[match['key']]}.{match['key']}{match['rest']}"
        expanded.append(arg)
    return expanded


def script_conf_dir() -> Path:
    """The running script's config directory: ``../conf`` next to it (as
    ``@hydra.main(config_path="../conf")`` resolves it), else the repository's ``conf/``."""
    beside = Path(sys.argv[0]).resolve().parent.parent / "conf"
    return beside if beside.is_dir() else CONF_DIR


def _is_rank_zero() -> bool:
    """False in the extra processes of a distributed run (they share rank 0's run directory)."""
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def run_artifacts(output_dir: str | Path) -> list[str]:
    """Names of the non-empty training outputs in `output_dir` (``checkpoints``, ``csv``...)."""
    out = Path(output_dir)
    return [name for name in RUN_ARTIFACTS if (out / name).is_dir() and any((out / name).iterdir())]


def check_run_dir(
    output_dir: str | Path, *, ckpt_path: str | None = None, overwrite: bool = False
) -> Path | None:
    """Decide what happens when a training run starts in `output_dir`.

    - An empty (or fresh Hydra) directory: start a new run; returns None.
    - ``checkpoints/last.ckpt`` (or a SLURM requeue ``hpc_ckpt_*.ckpt``) present: the run is
      resumed; returns the newest such path.
    - Training outputs but no ``last.ckpt``: refuses with `ConfigError`, unless an explicit
      `ckpt_path` is given (resume from it) or `overwrite` is true (the old outputs are
      deleted, with a warning).

    Only rank 0 checks: the other ranks of a distributed run share its directory.

    Raises:
        ConfigError: the directory holds a run that cannot be resumed and `overwrite` is false.
    """
    out = Path(output_dir)
    if not _is_rank_zero():
        return None
    resumable = [out / "checkpoints" / "last.ckpt", *out.glob("hpc_ckpt_*.ckpt")]
    resumable = [p for p in resumable if p.is_file()]
    if overwrite:
        found = run_artifacts(out)
        doomed = [out / name for name in found] + list(out.glob("hpc_ckpt_*.ckpt"))
        if ckpt_path and any(Path(ckpt_path).resolve().is_relative_to(d.resolve()) for d in doomed):
            raise ConfigError(
                f"overwrite=true would delete ckpt_path={ckpt_path} before resuming from it; "
                "copy the checkpoint out of the run directory first, or drop overwrite=true"
            )
        if found:
            log.warning("overwrite=true: deleting %s in %s", ", ".join(found), out)
            for name in found:
                shutil.rmtree(out / name)
        for p in out.glob("hpc_ckpt_*.ckpt"):
            p.unlink()
        return None
    if resumable:
        return max(resumable, key=lambda p: p.stat().st_mtime_ns)
    if ckpt_path:
        return None
    found = run_artifacts(out)
    if found:
        raise ConfigError(
            f"run directory {out} already holds a run ({', '.join(f + '/' for f in found)}) "
            "but no checkpoints/last.ckpt to resume from; choose a new directory with "
            "hydra.run.dir=PATH, resume with ckpt_path=PATH, or pass overwrite=true to "
            "delete it and start over"
        )
    return None


def _count(devices: object) -> int | None:
    """How many devices `trainer.devices` asks for; None for 'auto', -1 or unparsable."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices >= 0 else None
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)
    if isinstance(devices, str):
        text = devices.strip()
        if text.isdigit():
            return int(text)
        if "," in text:
            return len([d for d in text.split(",") if d.strip()])
    return None


def check_devices(
    accelerator: str | None,
    devices: object,
    *,
    cuda_count: int | None = None,
    cpu_count: int | None = None,
) -> None:
    """Refuse ``trainer.devices`` larger than what this machine has, with a one-line message.

    Args:
        accelerator: ``trainer.accelerator`` (auto, cpu, gpu, cuda, ...).
        devices: ``trainer.devices`` (an int, a list of ids, "0,1", "auto" or -1).
        cuda_count, cpu_count: for tests; default to what this machine has.

    Raises:
        ConfigError: e.g. ``trainer.devices=4 but this machine has 0 CUDA GPU(s)...``.
    """
    wanted = _count(devices)
    accel = str(accelerator or "auto").lower()
    if wanted is None or accel not in ("auto", "cpu", "gpu", "cuda"):
        return
    if wanted == 0:
        raise ConfigError("trainer.devices=0 selects no device; use trainer.devices=1 or more")
    if cuda_count is None:
        import torch

        cuda_count = torch.cuda.device_count()
    if cpu_count is None:
        cpu_count = usable_cores()
    if accel in ("gpu", "cuda") and wanted > cuda_count:
        raise ConfigError(
            f"trainer.devices={devices} but this machine has {cuda_count} CUDA GPU(s); "
            "lower trainer.devices, or train on the CPU with trainer=cpu"
        )
    if accel == "auto" and cuda_count == 0 and wanted > 1:
        raise ConfigError(
            f"trainer.devices={devices} but this machine has no CUDA GPU, so it would start "
            f"{wanted} CPU processes; use trainer.devices=1, or trainer.accelerator=cpu to "
            "train with several CPU processes on purpose"
        )
    if accel == "auto" and wanted > cuda_count > 0:
        raise ConfigError(
            f"trainer.devices={devices} but this machine has {cuda_count} CUDA GPU(s); "
            f"lower trainer.devices to at most {cuda_count}"
        )
    if accel == "cpu" and wanted > cpu_count:
        raise ConfigError(
            f"trainer.devices={devices} with trainer.accelerator=cpu starts one process per "
            f"device, but this machine has {cpu_count} CPU core(s); lower trainer.devices "
            f"to at most {cpu_count}"
        )
