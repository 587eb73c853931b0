"""The student pipeline's parts without training (`litmt.cli.distillation.student`, `stages`):
the stage markers (skip, resume, refuse), the student's corpus overrides and the split stem that
is a path, the checkpoint a run reports, the teacher signal (chosen, best, average, ensemble),
the distill and student commands (the distillation beam, the student's budget, a born-again
student), the pipeline's commands and refusals with the scripts faked, the settings' one-line
errors, and the student recipe's shape. scripts/student.py end to end:
tests/integration/cli/test_student_script.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from litmt.cli.distillation import student as pipeline
from litmt.cli.distillation.stages import RESUME, RUN, SKIP, StageMarker, data_digest, quoted
from litmt.cli.distillation.student import (
    StudentConfig,
    StudentData,
    chosen_model,
    distill_command,
    student_command,
    student_data_overrides,
    student_settings,
    teacher_models,
)
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"


def test_a_stage_runs_resumes_when_interrupted_skips_when_done(tmp_path: Path) -> None:
    settings = {"experiment": "multi30k_cpu", "overrides": ["a=1"], "data": "abc"}
    marker = StageMarker(tmp_path, "teacher", settings)
    assert marker.state() == RUN  # no marker
    marker.start()
    assert StageMarker(tmp_path, "teacher", settings).state() == RESUME  # killed mid-stage
    marker.finish({"checkpoint": "/x/best.ckpt"})
    again = StageMarker(tmp_path, "teacher", settings)
    assert again.state() == SKIP
    assert again.outputs() == {"checkpoint": "/x/best.ckpt"}
    assert json.loads((tmp_path / ".stages" / "teacher.json").read_text())["state"] == "done"


def test_a_stage_with_other_settings_is_refused_in_one_line(tmp_path: Path) -> None:
    StageMarker(tmp_path, "student", {"overrides": [], "mix_references": False}).start()
    other = StageMarker(tmp_path, "student", {"overrides": ["x=2"], "mix_references": False})
    with pytest.raises(ConfigError) as err:
        other.state()
    assert str(err.value) == (
        f"{tmp_path} holds a student stage run with other settings (differs in: overrides); "
        "rerun with those settings, or choose another out= directory"
    )


def test_the_data_digest_follows_the_corpus_files(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "train.de").write_text("b\n")
    (tmp_path / "notes.txt").write_text("not a corpus file\n")
    before = data_digest(tmp_path, ("en", "de"))
    (tmp_path / "notes.txt").write_text("changed\n")
    assert data_digest(tmp_path, ("en", "de")) == before
    (tmp_path / "train.de").write_text("b c\n")
    assert data_digest(tmp_path, ("en", "de")) != before


def test_the_student_reads_the_distilled_train_split_and_the_original_valid_test(tmp_path):
    orig, kd = tmp_path / "orig", tmp_path / "run" / "distilled"
    kd.mkdir(parents=True)
    orig.mkdir()
    for split in ("train", "valid", "test"):
        (orig / f"{split}.en").write_text(f"{split} en\n")
        (orig / f"{split}.de").write_text(f"{split} de\n")
    (kd / "train.en").write_text("train en\n")
    (kd / "train.de").write_text("teacher de\n")
    settings = StudentConfig(
        out=str(tmp_path / "run"), data=StudentData(dir=str(orig)), mix_references=False
    )
    overrides = student_data_overrides(settings, kd)
    assert overrides == [
        f"data.dir={quoted(orig)}", "data.src_lang=en", "data.tgt_lang=de",
        f"data.splits.train={quoted(kd / 'train')}",
    ]  # fmt: skip
    # what those overrides give ParallelCorpus: a stem that is a path replaces data.dir
    corpus = ParallelCorpus(
        src_lang="en", tgt_lang="de", dir=orig,
        splits={"train": str(kd / "train"), "valid": "valid", "test": "test"},
    )  # fmt: skip
    assert list(corpus.load("train")["tgt"]) == ["teacher de"]
    assert list(corpus.load("valid")["tgt"]) == ["valid de"]
    settings.mix_references = True  # the default: the original training split too
    assert StudentConfig().mix_references
    assert student_data_overrides(settings, kd)[-1] == (
        f"data.extra_train=[{{name: references, dir: {quoted(orig)}}}]"
    )


def test_quoted_paths_survive_hydra_overrides(tmp_path: Path) -> None:
    odd = tmp_path / "a dir=with [odd] it's"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("student", overrides=[f"out={quoted(odd)}"])
    assert cfg.out == str(odd)


def _scores(run: Path, chosen_model: str, chosen: dict | None, **more) -> None:
    report = {"best_checkpoint": str(run / "best.ckpt"), "average_checkpoint": str(run / "avg.ckpt"),
              "chosen_model": chosen_model, "chosen": chosen, **more}  # fmt: skip
    (run / "scores.json").write_text(json.dumps(report))


def test_the_chosen_checkpoint_and_decoding_come_from_scores_json(tmp_path: Path) -> None:
    beam = {"method": "beam", "beam_size": 5, "length_penalty": 1.0, "max_len_a": 1.2,
            "max_len_b": 10, "min_len": 0, "n_best": 1}  # fmt: skip
    _scores(tmp_path, "average", beam)
    assert chosen_model(tmp_path) == {
        "checkpoint": str(tmp_path / "avg.ckpt"),
        "decoding": {"beam_size": 5, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10},
    }
    _scores(tmp_path, "best", None)  # no beam grid: the greedy headline
    assert chosen_model(tmp_path) == {
        "checkpoint": str(tmp_path / "best.ckpt"),
        "decoding": {"beam_size": 1},
    }


def test_settings_errors_are_one_line(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("student", overrides=[f"data.dir={tmp_path}"])
        with pytest.raises(ConfigError, match=r"^give out=DIR, the pipeline's directory$"):
            student_settings(cfg)
        cfg = compose("student", overrides=[f"out={tmp_path}/run"])
        with pytest.raises(ConfigError, match=r"^give data.dir=DIR, the corpus directory"):
            student_settings(cfg)
        cfg = compose("student", overrides=[f"out={tmp_path}/run", f"data.dir={tmp_path}/no"])
        with pytest.raises(ConfigError, match=r"is not a directory$"):
            student_settings(cfg)
        cfg = compose("student", overrides=[f"out={tmp_path}/run", f"data.dir={tmp_path}"])
        settings = student_settings(cfg)
    assert settings.teacher_experiment == "multi30k_cpu"
    assert settings.student_experiment == "multi30k_student_cpu"
    assert (settings.quantization, settings.argos, settings.data.src_lang) == ("int8", True, "en")
    with pytest.raises(ConfigError, match=r"^unknown student keys \['mix'\]"):
        student_settings(OmegaConf.create({"out": "x", "mix": True, "data": {"dir": "."}}))


def test_the_student_recipe_is_the_teacher_recipe_with_a_deep_encoder_and_a_shallow_decoder() -> (
    None
):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        teacher = compose("train", overrides=["experiment=multi30k_cpu"])
        student = compose("train", overrides=["experiment=multi30k_student_cpu"])
    shape = ("d_model", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_positions")
    assert [student.model[k] for k in shape] == [144, 576, 6, 2, 256]
    assert student.data.tokenizer.vocab_size == 3000
    assert student.trainer.max_time == "00:00:58:00" == teacher.trainer.max_time
    assert student.task_name == "multi30k_student_cpu"
    for key in ("module", "finalize", "callbacks"):  # inherited as they are
        assert student[key] == teacher[key]
    assert student.data.max_tokens == teacher.data.max_tokens == 2048


def test_the_teacher_signal_picks_the_run_s_checkpoints(tmp_path: Path) -> None:
    kept = [str(tmp_path / f"epoch{i}.ckpt") for i in (4, 2, 3)]  # best first
    _scores(tmp_path, "average", None, averaged_from=kept)
    assert teacher_models(tmp_path, "chosen") == [str(tmp_path / "avg.ckpt")]
    assert teacher_models(tmp_path, "best") == [str(tmp_path / "best.ckpt")]
    assert teacher_models(tmp_path, "average") == [str(tmp_path / "avg.ckpt")]
    assert teacher_models(tmp_path, "ensemble") == kept
    _scores(tmp_path, "best", None, average_checkpoint=None, averaged_from=[])
    assert teacher_models(tmp_path, "chosen") == [str(tmp_path / "best.ckpt")]
    with pytest.raises(ConfigError, match=r"^teacher_signal=average: .* has no checkpoint average"):
        teacher_models(tmp_path, "average")
    one = tmp_path / "teacher.ckpt"
    one.write_bytes(b"")
    assert teacher_models(one, "chosen") == teacher_models(one, "best") == [str(one)]
    with pytest.raises(ConfigError, match=r"^teacher_signal=ensemble needs the teacher's train"):
        teacher_models(one, "ensemble")


def test_distill_command_one_teacher_on_ct2_several_as_a_torch_ensemble(tmp_path: Path) -> None:
    settings = StudentConfig(out=str(tmp_path), data=StudentData(dir=str(tmp_path)),
                             distill_overrides=["beam_size=4"])  # fmt: skip
    kd = tmp_path / "distilled"
    one = distill_command(settings, ["/t/best.ckpt"], kd)
    assert one[0] == "ckpt_path='/t/best.ckpt'" and "engine=torch" not in one
    assert one[-2:] == [f"out={quoted(kd)}", "beam_size=4"]  # the distillation beam, last
    two = distill_command(settings, ["/t/a.ckpt", "/t/b.ckpt"], kd)
    assert two[:3] == ["ckpt_path=['/t/a.ckpt','/t/b.ckpt']", "engine=torch", "ensemble=true"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("distill", overrides=[o.replace("beam_size", "decoding.beam_size")
                                            for o in two])  # fmt: skip
    assert list(cfg.ckpt_path) == ["/t/a.ckpt", "/t/b.ckpt"] and cfg.ensemble is True
    assert cfg.decoding.beam_size == 4


def _compose_train(command: list[str]):
    """The student's train config, as scripts/train.py composes `command` (its run dir aside)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[o for o in command if not o.startswith("hydra.")])


def test_the_student_trains_for_its_budget_unless_its_overrides_say(tmp_path: Path) -> None:
    data = StudentData(dir=str(tmp_path))
    kd, run = tmp_path / "distilled", tmp_path / "student"
    default = student_command(StudentConfig(out=str(tmp_path), data=data), kd, run)
    assert "trainer.max_time=00:00:58:00" in default
    assert _compose_train(default).trainer.max_time == "00:00:58:00"  # not the recipe's 29
    user = StudentConfig(out=str(tmp_path), data=data,
                         student_overrides=["++trainer.max_time=00:00:10:00"])  # fmt: skip
    command = student_command(user, kd, run)
    assert [o for o in command if "max_time" in o] == ["++trainer.max_time=00:00:10:00"]
    recipe = StudentConfig(out=str(tmp_path), data=data, student_max_time=None)
    assert not [o for o in student_command(recipe, kd, run) if "max_time" in o]


def test_a_born_again_student_has_the_teacher_s_shape(tmp_path: Path) -> None:
    settings = StudentConfig(out=str(tmp_path), data=StudentData(dir=str(tmp_path)),
                             student_experiment="multi30k_cpu")  # fmt: skip
    command = student_command(settings, tmp_path / "distilled", tmp_path / "student")
    student, teacher = _compose_train(command), _compose_train(["experiment=multi30k_cpu"])
    assert student.model == teacher.model and student.trainer == teacher.trainer
    assert student.data.splits.train == str(tmp_path / "distilled" / "train")


def fake_scripts(monkeypatch, calls: list[tuple[str, list[str]]]) -> None:
    """The stages' scripts replaced by what they leave behind (a teacher or student run's
    scores.json and checkpoints, a distilled corpus's distill.json); weights digests by path."""

    def value(overrides: list[str], key: str) -> Path:
        found = next(o for o in overrides if o.startswith(f"{key}="))
        return Path(found.split("=", 1)[1].strip("'"))

    def run_script(script: Path, overrides: list[str], stage: str) -> None:
        calls.append((script.name, overrides))
        if script.name == "train.py":
            run = value(overrides, "hydra.run.dir")
            run.mkdir(parents=True, exist_ok=True)
            kept = [str(run / f"epoch{i}.ckpt") for i in (3, 1)]
            _scores(run, "best", None, best_checkpoint=kept[0], average_checkpoint=None,
                    averaged_from=kept)  # fmt: skip
        elif script.name == "distill.py":
            out = value(overrides, "out")
            out.mkdir(parents=True, exist_ok=True)
            (out / "distill.json").write_text(json.dumps(overrides))

    monkeypatch.setattr(pipeline, "run_stage_script", run_script)
    monkeypatch.setattr(pipeline, "model_digest", lambda path: f"digest:{Path(path).name}")


def test_the_pipeline_s_commands_and_a_changed_signal_or_budget_refused(tmp_path, monkeypatch):
    calls: list[tuple[str, list[str]]] = []
    fake_scripts(monkeypatch, calls)
    (tmp_path / "corpus").mkdir()
    base = [f"out={tmp_path / 'run'}", f"data.dir={tmp_path / 'corpus'}"]

    def student(*more: str):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return pipeline.student(compose("student", overrides=[*base, *more]))

    student('distill_overrides=["beam_size=4"]')
    assert [name for name, _ in calls] == ["train.py", "distill.py", "train.py", "export.py",
                                           "export.py"]  # fmt: skip
    distill = calls[1][1]
    assert distill[0] == f"ckpt_path={quoted(tmp_path / 'run' / 'teacher' / 'epoch3.ckpt')}"
    assert distill[-1] == "beam_size=4"
    assert "trainer.max_time=00:00:58:00" in calls[2][1]
    calls.clear()
    student('distill_overrides=["beam_size=4"]')  # done: every stage skipped
    assert calls == []
    with pytest.raises(ConfigError, match=r"holds a distill stage run with other settings "
                       r"\(differs in: teacher\)"):  # fmt: skip
        student('distill_overrides=["beam_size=4"]', "teacher_signal=ensemble")
    with pytest.raises(ConfigError, match=r"differs in: overrides\)"):
        student('distill_overrides=["beam_size=5"]')
    with pytest.raises(ConfigError, match=r"holds a student stage run with other settings "
                       r"\(differs in: max_time\)"):  # fmt: skip
        student('distill_overrides=["beam_size=4"]', "student_max_time=00:00:29:00")
    assert calls == []  # refused before any script ran

    other = tmp_path / "ensemble"
    base[0] = f"out={other}"
    student(f"teacher={tmp_path / 'run' / 'teacher'}", "teacher_signal=ensemble")
    teacher = tmp_path / "run" / "teacher"
    assert calls[0][0] == "distill.py"  # a given teacher run: no teacher stage
    assert calls[0][1][:3] == [
        f"ckpt_path=[{quoted(teacher / 'epoch3.ckpt')},{quoted(teacher / 'epoch1.ckpt')}]",
        "engine=torch",
        "ensemble=true",
    ]


def test_new_settings_errors_are_one_line(tmp_path: Path) -> None:
    base = [f"out={tmp_path}/run", f"data.dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("student", overrides=[*base, "teacher_signal=mean"])
        with pytest.raises(ConfigError, match=r"^teacher_signal must be one of chosen, best, "):
            student_settings(cfg)
        cfg = compose("student", overrides=[*base, "student_max_time=58"])
        with pytest.raises(ConfigError, match=r"^student_max_time must be DD:HH:MM:SS"):
            student_settings(cfg)
        cfg = compose("student", overrides=[*base, "student_max_time=null"])
        assert student_settings(cfg).student_max_time is None
