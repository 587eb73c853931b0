"""The student command: `python scripts/student.py data.dir=DIR out=RUN [teacher=CKPT]`
(conf/student.yaml): a shippable distilled student from a data directory, in four stages.

1. teacher: ``scripts/train.py experiment={teacher_experiment}`` on ``data.dir`` into
   ``{out}/teacher`` (skipped when ``teacher`` names a checkpoint, an export or a run);
2. distill: ``scripts/distill.py`` translates the training split with the teacher into
   ``{out}/distilled``; of a teacher run, ``teacher_signal`` picks the checkpoint(s)
   (`teacher_models`: the one its finalize chose, its best, its average, or its kept
   checkpoints decoded as an ensemble on the torch engine);
3. student: ``scripts/train.py experiment={student_experiment}`` into ``{out}/student``, its
   training split the distilled one (``data.splits.train={out}/distilled/train``) and, with
   ``mix_references`` (the default), the original split too, through ``data.extra_train``;
   valid and test the original ones, its budget ``trainer.max_time={student_max_time}``
   unless ``student_overrides`` sets it;
4. export: the student's chosen checkpoint and decoding (its ``scores.json``) as a
   CTranslate2 directory ``{out}/exports/student-{quantization}`` and an Argos package
   ``{out}/exports/student.argosmodel``.

Each stage runs the real script in a subprocess with the overrides a user would type: each
script composes its own Hydra config, exactly as on the command line. Resuming and refusing
are the stage markers' (`litmt.cli.distillation.stages`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litmt.cli.distillation.stages import RUN, SKIP, StageMarker, data_digest, model_digest, quoted
from litmt.cli.distillation.stages import run_script as run_stage_script
from litmt.cli.finalize import kept_checkpoints
from litmt.cli.script.config_check import script_conf_dir
from litmt.config import build, plain
from litmt.data.config import resolve_path
from litmt.deploy.export.base import DECODING_KEYS, file_sha256
from litmt.deploy.export.ct2 import is_export_dir
from litmt.errors import ConfigError
from litmt.training.finalize import SCORES_FILE, best_checkpoints

log = logging.getLogger(__name__)

STAGES = ("teacher", "distill", "student", "export")
SIGNALS = ("chosen", "best", "average", "ensemble")


@dataclass
class StudentData:
    """The corpus every stage reads (conf/student.yaml ``data``)."""

    dir: str | None = None
    """directory of the corpus files {split}.{src_lang}, {split}.{tgt_lang} (required): the
    teacher trains on it, distill translates its training split, the student validates and
    tests on it"""
    src_lang: str = "en"
    """source language (the files' suffix)"""
    tgt_lang: str = "de"
    """target language"""


@dataclass
class StudentConfig:
    """The student command's settings (conf/student.yaml)."""

    out: str | None = None
    """the pipeline's directory: teacher/, distilled/, student/, exports/ and the stage markers
    .stages/ (required; a rerun skips the done stages and resumes an interrupted one)"""
    teacher: str | None = None
    """an existing teacher: a .ckpt, a CTranslate2 export directory, or a training run
    directory (its scores.json and checkpoints/, read as teacher_signal says); null = train
    one"""
    teacher_experiment: str = "multi30k_cpu"
    """the teacher's recipe (conf/experiment/)"""
    teacher_signal: str = "chosen"
    """what of the teacher's run distils: chosen (the checkpoint its finalize chose on valid,
    best or average), best (its best checkpoint), average (its checkpoint average,
    avg_bestN.ckpt), ensemble (the kept checkpoints its average was made of, else all it kept,
    decoded together on engine=torch); a teacher given as one .ckpt or export is itself"""
    student_experiment: str = "multi30k_student_cpu"
    """the student's recipe (conf/experiment/); multi30k_cpu = a born-again student of the
    teacher's own shape"""
    student_max_time: str | None = "00:00:58:00"
    """the student's training budget (trainer.max_time, DD:HH:MM:SS), the teacher recipe's;
    a trainer.max_time in student_overrides wins; null = the student recipe's own"""
    mix_references: bool = True
    """the student also trains on the original training split (data.extra_train); false = on
    the distilled corpus only"""
    quantization: str = "int8"
    """the exported student's weights (scripts/export.py quantization)"""
    argos: bool = True
    """also export an Argos Translate package"""
    teacher_overrides: list[str] = field(default_factory=list)
    """more overrides of the teacher's scripts/train.py, e.g. ["trainer.max_time=00:00:30:00"]"""
    distill_overrides: list[str] = field(default_factory=list)
    """more overrides of scripts/distill.py, e.g. ["beam_size=4"] (the distillation beam),
    ["select=closest", "n_best=5"] (Seq-Inter), ["filter_ce_quantile=0.05"]"""
    student_overrides: list[str] = field(default_factory=list)
    """more overrides of the student's scripts/train.py, e.g. ["model.d_model=128",
    "model.n_decoder_layers=2"] (another shape)"""
    data: StudentData = field(default_factory=StudentData)
    """the corpus"""


def student_settings(cfg: DictConfig) -> StudentConfig:
    """The command's settings, checked: ``out`` and ``data.dir`` given, the corpus there.

    Raises:
        ConfigError: a missing ``out`` or ``data.dir``, an unknown key, no such directory.
    """
    values = {k: v for k, v in plain(cfg).items() if k not in ("hydra", "data")}
    settings = build(StudentConfig, values, "student")
    settings.data = build(StudentData, plain(cfg.get("data")), "student.data")
    if settings.out is None:
        raise ConfigError("give out=DIR, the pipeline's directory")
    if settings.data.dir is None:
        raise ConfigError("give data.dir=DIR, the corpus directory ({split}.{lang} files)")
    if not resolve_path(settings.data.dir).is_dir():
        raise ConfigError(f"data.dir={settings.data.dir} is not a directory")
    if settings.teacher_signal not in SIGNALS:
        raise ConfigError(
            f"teacher_signal must be one of {', '.join(SIGNALS)}, got {settings.teacher_signal!r}"
        )
    budget = settings.student_max_time
    if budget is not None and not re.fullmatch(r"\d+:\d\d:\d\d:\d\d", str(budget)):
        raise ConfigError(
            f"student_max_time must be DD:HH:MM:SS (e.g. 00:00:58:00) or null, got {budget!r}"
        )
    return settings


def chosen_model(run_dir: Path) -> dict[str, Any]:
    """The checkpoint and decoding a training run reports: its ``scores.json`` choice (finalize:
    the best checkpoint or the average, greedy or the beam chosen on valid), else the best
    kept checkpoint with the default decoding.

    Returns:
        ``{"checkpoint": path, "decoding": {beam_size, length_penalty, ...}}``.
    """
    scores = run_dir / SCORES_FILE
    if scores.is_file():
        report = json.loads(scores.read_text(encoding="utf-8"))
        key = "average_checkpoint" if report["chosen_model"] == "average" else "best_checkpoint"
        chosen = report.get("chosen") or {"beam_size": 1}
        decoding = {k: chosen[k] for k in DECODING_KEYS if k in chosen}
        return {"checkpoint": report[key], "decoding": decoding}
    kept = kept_checkpoints(run_dir / "checkpoints" / "last.ckpt")
    if not kept:
        raise ConfigError(f"{run_dir} kept no checkpoint: nothing to distil or export")
    log.info("%s has no %s (finalize off): the best checkpoint, default decoding", run_dir,
             SCORES_FILE)  # fmt: skip
    return {"checkpoint": max(kept, key=kept.__getitem__), "decoding": {}}


def run_checkpoints(run_dir: Path) -> list[str]:
    """The checkpoints a training run kept (its ``last.ckpt``'s `ModelCheckpoint` state), best
    first, each set of weights once.

    Raises:
        ConfigError: the run kept none.
        CheckpointError: no readable ``checkpoints/last.ckpt``.
    """
    kept = kept_checkpoints(run_dir / "checkpoints" / "last.ckpt")
    if not kept:
        raise ConfigError(f"{run_dir} kept no checkpoint: nothing to distil or export")
    return best_checkpoints(kept, len(kept))


def teacher_models(teacher: str | Path, signal: str) -> list[str]:
    """The checkpoint(s) distill decodes for ``teacher_signal`` `signal`.

    A .ckpt or an export is itself. A training run directory gives its finalize's choice
    (``chosen``: `chosen_model`), its best checkpoint, its average (``scores.json``'s
    ``average_checkpoint``), or for ``ensemble`` the checkpoints that average was made of
    (``averaged_from``; without them the kept ones, `run_checkpoints`).

    Raises:
        ConfigError: average or ensemble of one model, a run without an average, an
            ensemble of fewer than two checkpoints.
    """
    path = Path(teacher)
    if is_export_dir(path) or not path.is_dir():
        if signal in ("average", "ensemble"):
            raise ConfigError(
                f"teacher_signal={signal} needs the teacher's training run, not one model "
                f"({path}): pass teacher=RUN_DIR (its scores.json and checkpoints/)"
            )
        return [str(path)]
    if signal == "chosen":
        return [str(chosen_model(path)["checkpoint"])]
    scores = path / SCORES_FILE
    report = json.loads(scores.read_text(encoding="utf-8")) if scores.is_file() else {}
    if signal == "best":
        return [str(report.get("best_checkpoint") or run_checkpoints(path)[0])]
    if signal == "average":
        if not report.get("average_checkpoint"):
            raise ConfigError(
                f"teacher_signal=average: {path} has no checkpoint average (no {SCORES_FILE}, "
                "or its finalize averaged nothing: finalize.average_best <= 1 or fewer than two "
                "checkpoints kept); use teacher_signal=best"
            )
        return [str(report["average_checkpoint"])]
    models = [str(m) for m in report.get("averaged_from") or run_checkpoints(path)]
    if len(models) < 2:
        raise ConfigError(
            f"teacher_signal=ensemble: {path} kept {len(models)} checkpoint(s); an ensemble "
            "needs two or more (callbacks.model_checkpoint.save_top_k)"
        )
    return models


def run_stage(
    marker: StageMarker,
    commands: list[tuple[str, list[str]]],
    where: Path,
    outputs: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """Skip a done stage, else run its scripts and mark it done; one log line each way.

    Args:
        commands: (script name, overrides) run in order.
        outputs: () -> the outputs recorded in the marker (read after the scripts ran).
    """
    number = f"{STAGES.index(marker.name) + 1}/{len(STAGES)}"
    state = marker.state()
    if state == SKIP:
        log.info("stage %s %s: skipped, done in %s", number, marker.name, where)
        return marker.outputs()
    how = "run" if state == RUN else "resumed (interrupted before)"
    log.info("stage %s %s: %s -> %s", number, marker.name, how, where)
    marker.start()
    scripts = script_conf_dir().parent / "scripts"
    for script, overrides in commands:
        run_stage_script(scripts / script, overrides, marker.name)
    done = outputs()
    marker.finish(done)
    log.info("stage %s %s: done in %s", number, marker.name, where)
    return done


def data_overrides(settings: StudentConfig) -> list[str]:
    """The corpus as overrides of every script."""
    data = settings.data
    path = resolve_path(str(data.dir))
    return [f"data.dir={quoted(path)}", f"data.src_lang={data.src_lang}",
            f"data.tgt_lang={data.tgt_lang}"]  # fmt: skip


def student_data_overrides(settings: StudentConfig, distilled: Path) -> list[str]:
    """The student's corpus: the distilled training split, the original valid and test (a
    split stem that is a path replaces ``data.dir`` for that split), and with
    ``mix_references`` the original training split as an extra source."""
    found = [*data_overrides(settings), f"data.splits.train={quoted(distilled / 'train')}"]
    if settings.mix_references:
        path = quoted(resolve_path(str(settings.data.dir)))
        found.append(f"data.extra_train=[{{name: references, dir: {path}}}]")
    return found


def sets_key(overrides: list[str], key: str) -> bool:
    """Whether one of `overrides` sets `key` (``key=...``, ``+key=...``, ``++key=...``)."""
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides)


def distill_command(settings: StudentConfig, models: list[str], distilled: Path) -> list[str]:
    """scripts/distill.py's overrides: one teacher on its default engine (ct2, int8), several
    as an ensemble on the torch engine (CTranslate2 decodes one model)."""
    if len(models) == 1:
        teacher = [f"ckpt_path={quoted(models[0])}"]
    else:
        listed = ",".join(quoted(m) for m in models)
        teacher = [f"ckpt_path=[{listed}]", "engine=torch", "ensemble=true"]
    return [*teacher, *data_overrides(settings), f"out={quoted(distilled)}",
            *settings.distill_overrides]  # fmt: skip


def distill_stage(settings: StudentConfig, out: Path, data: str, models: list[str]) -> Path:
    """Stage 2: distil the training split with the teacher's `models` (`teacher_models`)."""
    distilled = out / "distilled"
    digests = [model_digest(m) for m in models]
    key = {"teacher": digests[0] if len(digests) == 1 else digests, "data": data,
           "overrides": settings.distill_overrides}  # fmt: skip
    command = distill_command(settings, models, distilled)
    run_stage(
        StageMarker(out, "distill", key), [("distill.py", command)], distilled,
        lambda: {"corpus": str(distilled)},
    )  # fmt: skip
    return distilled


def student(cfg: DictConfig) -> dict[str, Any]:
    """Run the four stages (module docstring); returns the exports' paths."""
    settings = student_settings(cfg)
    out = resolve_path(settings.out)
    langs = (settings.data.src_lang, settings.data.tgt_lang)
    data = data_digest(resolve_path(str(settings.data.dir)), langs)
    teacher = teacher_stage(settings, out, data)
    models = teacher_models(teacher, settings.teacher_signal)
    distilled = distill_stage(settings, out, data, models)
    chosen = student_stage(settings, out, data, distilled)
    exports = export_stage(settings, out, chosen)
    log.info("student: %s", ", ".join(str(p) for p in exports.values()))
    return exports


def teacher_stage(settings: StudentConfig, out: Path, data: str) -> str:
    """Stage 1: the given teacher, else a trained one: its run directory (`teacher_models`
    reads it)."""
    if settings.teacher is not None:
        if settings.teacher_overrides:
            log.warning("teacher=%s is given: teacher_overrides are not used", settings.teacher)
        log.info("stage 1/%d teacher: skipped, given: %s", len(STAGES), settings.teacher)
        return str(resolve_path(settings.teacher))
    run_dir = out / "teacher"
    experiment = settings.teacher_experiment
    marker = StageMarker(out, "teacher", {"experiment": experiment, "data": data,
                                          "overrides": settings.teacher_overrides})  # fmt: skip
    command = [f"experiment={experiment}", *data_overrides(settings),
               f"hydra.run.dir={quoted(run_dir)}", *settings.teacher_overrides]  # fmt: skip
    run_stage(marker, [("train.py", command)], run_dir, lambda: chosen_model(run_dir))
    return str(run_dir)


def student_budget(settings: StudentConfig) -> str | None:
    """The ``trainer.max_time`` the student stage adds: ``student_max_time``, unless it is null
    or ``student_overrides`` sets ``trainer.max_time`` itself (None: nothing added)."""
    if settings.student_max_time is None:
        return None
    if sets_key(settings.student_overrides, "trainer.max_time"):
        return None
    return str(settings.student_max_time)


def student_command(settings: StudentConfig, distilled: Path, run_dir: Path) -> list[str]:
    """The student's scripts/train.py overrides: its recipe, its corpus, its budget
    (`student_budget`), its run directory, then ``student_overrides``."""
    budget = student_budget(settings)
    return [f"experiment={settings.student_experiment}",
            *student_data_overrides(settings, distilled),
            *([f"trainer.max_time={budget}"] if budget is not None else []),
            f"hydra.run.dir={quoted(run_dir)}", *settings.student_overrides]  # fmt: skip


def student_stage(settings: StudentConfig, out: Path, data: str, distilled: Path) -> dict[str, Any]:
    """Stage 3: train the student on the distilled corpus; its chosen checkpoint and decoding."""
    run_dir = out / "student"
    key = {
        "experiment": settings.student_experiment,
        "data": data,
        "distilled": file_sha256(distilled / "distill.json"),
        "mix_references": settings.mix_references,
        "overrides": settings.student_overrides,
    }
    budget = student_budget(settings)
    if budget is not None:  # absent when none is added: a marker written before it still holds
        key["max_time"] = budget
    command = student_command(settings, distilled, run_dir)
    return run_stage(
        StageMarker(out, "student", key), [("train.py", command)], run_dir,
        lambda: chosen_model(run_dir),
    )  # fmt: skip


def export_stage(settings: StudentConfig, out: Path, chosen: dict[str, Any]) -> dict[str, Any]:
    """Stage 4: the student as a CTranslate2 directory and an Argos package, with the decoding
    it chose on valid written as their defaults."""
    where = out / "exports"
    q = settings.quantization
    outputs = {"ct2": str(where / f"student-{q}")}
    if settings.argos:
        outputs["argos"] = str(where / "student.argosmodel")
    decoding = [f"decoding.{k}={v}" for k, v in chosen["decoding"].items()]
    common = [f"ckpt_path={quoted(chosen['checkpoint'])}", f"quantization={q}", "force=true"]
    commands = [("export.py", [*common, f"out={quoted(outputs['ct2'])}", *decoding])]
    if settings.argos:
        commands.append(
            ("export.py", [*common, "format=argos", f"out={quoted(outputs['argos'])}", *decoding])
        )
    key = {"checkpoint": model_digest(chosen["checkpoint"]), "decoding": chosen["decoding"],
           "quantization": q, "argos": settings.argos}  # fmt: skip
    return run_stage(StageMarker(out, "export", key), commands, where, lambda: outputs)


__all__ = [
    "SIGNALS",
    "STAGES",
    "StudentConfig",
    "StudentData",
    "chosen_model",
    "distill_command",
    "run_checkpoints",
    "student",
    "student_budget",
    "student_command",
    "student_data_overrides",
    "student_settings",
    "teacher_models",
]
