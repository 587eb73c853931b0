"""The student pipeline's parts without training (`litmt.cli.distillation.student`, `student_stages`): the
stage markers (skip, resume, refuse), the student's corpus overrides and the split stem that is
a path, the checkpoint a run reports, the settings' one-line errors, and the student recipe's
shape. scripts/student.py end to end: tests/integration/cli/test_student_script.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from litmt.cli.distillation.stages import RESUME, RUN, SKIP, StageMarker, data_digest, quoted
from litmt.cli.distillation.student import (
    StudentConfig,
    StudentData,
    chosen_model,
    student_data_overrides,
    student_settings,
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
    settings = StudentConfig(out=str(tmp_path / "run"), data=StudentData(dir=str(orig)))
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
    settings.mix_references = True
    assert student_data_overrides(settings, kd)[-1] == (
        f"data.extra_train=[{{name: references, dir: {quoted(orig)}}}]"
    )


def test_quoted_paths_survive_hydra_overrides(tmp_path: Path) -> None:
    odd = tmp_path / "a dir=with [odd] it's"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("student", overrides=[f"out={quoted(odd)}"])
    assert cfg.out == str(odd)


def _scores(run: Path, chosen_model: str, chosen: dict | None) -> None:
    report = {"best_checkpoint": str(run / "best.ckpt"), "average_checkpoint": str(run / "avg.ckpt"),
              "chosen_model": chosen_model, "chosen": chosen}  # fmt: skip
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


def test_the_student_recipe_is_the_teacher_recipe_with_a_small_shallow_model() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        teacher = compose("train", overrides=["experiment=multi30k_cpu"])
        student = compose("train", overrides=["experiment=multi30k_student_cpu"])
    shape = ("d_model", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_positions")
    assert [student.model[k] for k in shape] == [80, 320, 6, 1, 256]
    assert student.data.tokenizer.vocab_size == 3000
    assert student.trainer.max_time == "00:00:29:00"
    assert student.task_name == "multi30k_student_cpu"
    for key in ("module", "finalize", "callbacks"):  # inherited as they are
        assert student[key] == teacher[key]
    assert student.data.max_tokens == teacher.data.max_tokens == 2048
