"""The student command: `python scripts/student.py data.dir=DIR out=RUN [teacher=CKPT]`
(conf/student.yaml): a shippable distilled student from a data directory, in four stages.

1. teacher: ``scripts/train.py experiment={teacher_experiment}`` on ``data.dir`` into
   ``{out}/teacher`` (skipped when ``teacher`` names a checkpoint or an export);
2. distill: ``scripts/distill.py`` translates the training split with the teacher into
   ``{out}/distilled``;
3. student: ``scripts/train.py experiment={student_experiment}`` into ``{out}/student``, its
   training split the distilled one (``data.splits.train={out}/distilled/train``; with
   ``mix_references`` the original split too, through ``data.extra_train``), valid and test
   the original ones;
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
from litmt.errors import ConfigError
from litmt.training.finalize import SCORES_FILE

log = logging.getLogger(__name__)

STAGES = ("teacher", "distill", "student", "export")


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
    """an existing teacher, a .ckpt or a CTranslate2 export directory; null = train one"""
    teacher_experiment: str = "multi30k_cpu"
    """the teacher's recipe (conf/experiment/)"""
    student_experiment: str = "multi30k_student_cpu"
    """the student's recipe (conf/experiment/)"""
    mix_references: bool = False
    """the student also trains on the original training split (data.extra_train)"""
    quantization: str = "int8"
    """the exported student's weights (scripts/export.py quantization)"""
    argos: bool = True
    """also export an Argos Translate package"""
    teacher_overrides: list[str] = field(default_factory=list)
    """more overrides of the teacher's scripts/train.py, e.g. ["trainer.max_time=00:00:30:00"]"""
    distill_overrides: list[str] = field(default_factory=list)
    """more overrides of scripts/distill.py, e.g. ["beam_size=4"]"""
    student_overrides: list[str] = field(default_factory=list)
    """more overrides of the student's scripts/train.py, e.g. ["data.splits.test=test"]"""
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


def student(cfg: DictConfig) -> dict[str, Any]:
    """Run the four stages (module docstring); returns the exports' paths."""
    settings = student_settings(cfg)
    out = resolve_path(settings.out)
    langs = (settings.data.src_lang, settings.data.tgt_lang)
    data = data_digest(resolve_path(str(settings.data.dir)), langs)
    teacher = teacher_stage(settings, out, data)
    distilled = out / "distilled"
    marker = StageMarker(out, "distill", {"teacher": model_digest(teacher), "data": data,
                                         "overrides": settings.distill_overrides})  # fmt: skip
    command = [f"ckpt_path={quoted(teacher)}", *data_overrides(settings),
               f"out={quoted(distilled)}", *settings.distill_overrides]  # fmt: skip
    run_stage(marker, [("distill.py", command)], distilled, lambda: {"corpus": str(distilled)})
    chosen = student_stage(settings, out, data, distilled)
    exports = export_stage(settings, out, chosen)
    log.info("student: %s", ", ".join(str(p) for p in exports.values()))
    return exports


def teacher_stage(settings: StudentConfig, out: Path, data: str) -> str:
    """Stage 1: the given teacher, else a trained one (its chosen checkpoint)."""
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
    done = run_stage(marker, [("train.py", command)], run_dir, lambda: chosen_model(run_dir))
    return str(done["checkpoint"])


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
    command = [f"experiment={settings.student_experiment}",
               *student_data_overrides(settings, distilled),
               f"hydra.run.dir={quoted(run_dir)}", *settings.student_overrides]  # fmt: skip
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
    "STAGES",
    "StudentConfig",
    "StudentData",
    "chosen_model",
    "student",
    "student_data_overrides",
    "student_settings",
]
