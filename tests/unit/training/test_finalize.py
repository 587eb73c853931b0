"""The end of a training run (`litmt.training.finalize`): the average of the best checkpoints, the
beam/length-penalty choice made on valid only, and the test scores in scores.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from train_utils import (
    REPO,
    compose_train,
    run_train_script,
    script_env,
    tiny_overrides,
    write_toy_corpus,
)

import litmt.cli.finalize
import litmt.training.finalize
from litmt.checkpoint.io import FORMAT_VERSION, META_KEY, load_checkpoint, model_state_dict
from litmt.cli.finalize import finalize_run
from litmt.cli.train import train
from litmt.errors import ConfigError
from litmt.training.finalize import check_finalize_config, finalize, flat_metrics, summary_lines

SIZES = {"train": 600, "valid": 30, "test": 30}


def _tiny_run(tmp_path: Path, extra: list[str], epochs: int = 5) -> list[str]:
    corpus = write_toy_corpus(tmp_path / "corpus", SIZES)
    return [
        *tiny_overrides(corpus, tmp_path),
        f"trainer.max_epochs={epochs}",
        "module.optimizer.lr=3e-3",
        "module.scheduler.warmup_steps=20",
        *extra,
    ]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, float, float, str]]:
    """Record (split, beam size, length penalty, BLEU, checkpoint) of every decode+score call;
    the checkpoint is the path the scored translator was loaded from."""
    calls: list[tuple[str, int, float, float, str]] = []
    real = litmt.training.finalize.bleu_on_split
    real_load = litmt.training.finalize.Translator.from_checkpoint
    loaded_from: dict[int, str] = {}

    def load(path, **kwargs):
        translator = real_load(path, **kwargs)
        loaded_from[id(translator)] = str(path)
        return translator

    def spy(translator, split, config, max_tokens):
        scores = real(translator, split, config, max_tokens)
        ckpt = loaded_from[id(translator)]
        calls.append((split.name, config.beam_size, config.length_penalty, scores["bleu"], ckpt))
        return scores

    monkeypatch.setattr(litmt.training.finalize.Translator, "from_checkpoint", load)
    monkeypatch.setattr(litmt.training.finalize, "bleu_on_split", spy)
    return calls


def _kept_scores(last: str) -> dict[str, float]:
    """ModelCheckpoint's exact {path: valid BLEU} of the kept checkpoints, from last.ckpt."""
    state = torch.load(last, map_location="cpu", weights_only=True)["callbacks"]
    (kept,) = [v["best_k_models"] for k, v in state.items() if k.startswith("ModelCheckpoint")]
    return {p: float(s) for p, s in kept.items()}


def test_run_averages_the_best_two_chooses_on_valid_and_scores_test(tmp_path, monkeypatch, capsys):
    calls = _spy(monkeypatch)
    cfg = compose_train(
        _tiny_run(
            tmp_path,
            [
                "finalize.average_best=2",
                "finalize.beam_sizes=[1,2]",
                "finalize.length_penalties=[0.6,1.0]",
                "data.extra_test=[test,nosuch]",
            ],
        ),
        tmp_path,
    )
    metrics = train(cfg)
    report = json.loads((tmp_path / "run" / "scores.json").read_text())

    # the average is avg_best2.ckpt, of the two kept checkpoints with the highest valid BLEU
    ckpt_dir = Path(metrics["best_checkpoint"]).parent
    assert report["average_checkpoint"] == str(ckpt_dir / "avg_best2.ckpt")
    averaged = report["averaged_from"]
    assert len(averaged) == 2 and report["best_checkpoint"] == metrics["best_checkpoint"]
    kept = _kept_scores(metrics["last_checkpoint"])
    assert len(kept) == 3, "save_top_k=3 over 5 validations keeps three checkpoints"
    assert len(set(kept.values())) == 3, f"tied validation BLEU, the test proves less: {kept}"
    assert averaged == sorted(kept, key=kept.get, reverse=True)[:2]  # the two best, best first
    two = [model_state_dict(load_checkpoint(p)) for p in averaged]
    avg = model_state_dict(load_checkpoint(report["average_checkpoint"]))
    assert set(avg) == set(two[0])
    for key, value in avg.items():
        torch.testing.assert_close(value, (two[0][key] + two[1][key]) / 2)

    # first the model is chosen on valid (greedy, both models), then the grid is decoded on
    # valid with that model, every point once (greedy reused), before test is touched
    average, best = report["average_checkpoint"], report["best_checkpoint"]
    assert [(s, b, m) for s, b, _, _, m in calls[:2]] == [("valid", 1, best), ("valid", 1, average)]
    v_best, v_avg = calls[0][3], calls[1][3]
    assert report["valid_models"]["best"]["bleu"] == v_best
    assert report["valid_models"]["average"]["bleu"] == v_avg
    model = report["chosen_model"]
    assert model == ("average" if v_avg >= v_best else "best")
    model_ckpt = average if model == "average" else best
    grid = [(2, 0.6), (2, 1.0)]
    assert [(s, b, a, m) for s, b, a, _, m in calls[2:4]] == [
        ("valid", b, a, model_ckpt) for b, a in grid
    ]
    greedy_valid = v_avg if model == "average" else v_best
    assert [g["bleu"] for g in report["valid_grid"]] == [greedy_valid, calls[2][3], calls[3][3]]
    points = [(1, 0.6, greedy_valid), *((c[1], c[2], c[3]) for c in calls[2:4])]
    best_point = (None, *max(points, key=lambda c: c[2]))
    chosen = report["chosen"]
    assert (chosen["beam_size"], chosen["length_penalty"]) == best_point[1:3]
    # then test: best and average, each greedy and with the choice, and nothing else; each
    # model's scores come from decoding that model's checkpoint
    decodings = [(1, 1.0), best_point[1:3]]
    assert [(c[0], *c[1:3], c[4]) for c in calls[4:8]] == [
        ("test", *d, ckpt) for ckpt in (best, average) for d in decodings
    ]
    # then the extra test sets (data.extra_test=[test,nosuch]), with the chosen model only
    assert [(c[0], *c[1:3], c[4]) for c in calls[8:]] == [
        ("test", *d, model_ckpt) for d in decodings
    ]
    final = report["final"]
    assert (final["model"], final["decoding"]) == (model, "chosen")
    assert final["checkpoint"] == model_ckpt  # the file the chosen model is
    assert final["bleu"] == report["test"][model]["chosen"]["bleu"] == metrics["final/bleu"]
    for (_, _, _, bleu, ckpt), decoding in zip(calls[4:8], ["greedy", "chosen"] * 2, strict=True):
        model = "best" if ckpt == best else "average"
        assert report["test"][model][decoding]["bleu"] == bleu
    assert set(report["test"]) == {"best", "average"}
    for model in ("best", "average"):
        assert set(report["test"][model]) == {"greedy", "chosen"}
        for decoding in ("greedy", "chosen"):
            scores = report["test"][model][decoding]
            assert set(scores) == {"bleu", "chrf"}
            assert metrics[f"final/{model}/{decoding}/bleu"] == scores["bleu"]
    assert report["decoding"]["greedy"]["beam_size"] == 1
    assert metrics["scores_file"] == str(tmp_path / "run" / "scores.json")

    # extra test sets: "test" (the test split's own files) scores what test scored with the
    # chosen model; "nosuch" has no files and is skipped, the run does not fail
    assert report["extra_test"]["test"] == report["test"][model]
    assert list(report["extra_test"]["nosuch"]) == ["skipped"]
    assert metrics["final/extra/test/chosen/bleu"] == report["test"][model]["chosen"]["bleu"]

    # the final lines the user reads: the choice with its valid BLEU, then the four test scores
    printed = capsys.readouterr().out.splitlines()
    assert "extra test nosuch en-de: skipped (not in the data)" in printed
    f = report["final"]
    assert f"final test ({model}, chosen): BLEU {f['bleu']:.2f} chrF {f['chrf']:.2f}" in printed
    b, a, v = best_point[1], best_point[2], best_point[3]
    assert f"chosen on valid: beam {b}, length penalty {a} (valid BLEU {v:.2f})" in printed
    for model in ("best", "average"):
        for decoding in ("greedy", "chosen"):
            s = report["test"][model][decoding]
            line = f"test {model} {decoding}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}"
            assert line in printed


class _Corpus:
    """A stand-in `ParallelCorpus`: one sentence per split."""

    def load(self, split: str) -> dict[str, list[str]]:
        return {"src": [f"{split} source"], "tgt": [f"{split} reference"]}


def _stub_decoding(
    monkeypatch: pytest.MonkeyPatch,
    gain: dict[tuple[int, float], float],
    base: dict[str, float] | None = None,
):
    """Replace averaging, loading and decode+score by stubs: every checkpoint scores its own
    BLEU (`base`, by default avg_best2.ckpt 40, epoch=1 30, else 20), + 5 on test (+ 1 on
    any other split), + `gain` at (beam, penalty).
    Returns the calls: (checkpoint name, split, beam size, length penalty, max_tokens)."""
    calls: list[tuple[str, str, int, float, int]] = []

    class Loaded:
        def __init__(self, path: str) -> None:
            self.name = Path(path).name

        @classmethod
        def from_checkpoint(cls, path: str) -> Loaded:
            return cls(path)

    def bleu(name: str, split: str, beam: int, alpha: float) -> float:
        score = (base or {"avg_best2.ckpt": 40.0, "epoch=1.ckpt": 30.0}).get(name, 20.0)
        score += {"test": 5.0, "valid": 0.0}.get(split, 1.0)
        return score + gain.get((beam, alpha), 0.0)

    def score(translator, split, config, max_tokens):
        calls.append(
            (translator.name, split.name, config.beam_size, config.length_penalty, max_tokens)
        )
        b = bleu(translator.name, split.name, config.beam_size, config.length_penalty)
        return {"bleu": b, "chrf": b + 10}

    def average(paths, out):
        Path(out).write_text(" + ".join(Path(p).name for p in paths))

    monkeypatch.setattr(litmt.training.finalize, "Translator", Loaded)
    monkeypatch.setattr(litmt.training.finalize, "bleu_on_split", score)
    monkeypatch.setattr(litmt.training.finalize, "average_checkpoints", average)
    monkeypatch.setattr(litmt.training.finalize, "weights_digest", str)  # empty files: all differ
    return calls, bleu


def _kept_files(tmp_path: Path) -> dict[str, float]:
    """Three kept checkpoints (empty files) with their valid BLEU: epoch=1 best, then epoch=2."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    kept = {str(ckpts / f"epoch={i}.ckpt"): s for i, s in enumerate([20.0, 30.0, 25.0])}
    for path in kept:
        Path(path).touch()
    return kept


def test_each_test_line_scores_the_model_it_names(tmp_path, monkeypatch):
    """Decoding is stubbed so that the best checkpoint and the average score differently: the
    grid is decoded with the average, "test best" with the best checkpoint, "test average" with
    avg_best2.ckpt, in scores.json, the printed lines and train()'s metrics alike."""
    calls, bleu = _stub_decoding(monkeypatch, gain={(4, 0.6): 3.0, (4, 1.0): 1.0})
    kept = _kept_files(tmp_path)
    best = str(tmp_path / "checkpoints" / "epoch=1.ckpt")
    fin = OmegaConf.create(
        {"average_best": 2, "beam_sizes": [1, 4], "length_penalties": [0.6, 1.0], "max_tokens": 77}
    )
    report = finalize(fin, best_k_models=kept, best=best, corpus=_Corpus(), output_dir=tmp_path)

    average = tmp_path / "checkpoints" / "avg_best2.ckpt"
    assert report["average_checkpoint"] == str(average)
    assert average.read_text() == "epoch=1.ckpt + epoch=2.ckpt"  # the two best, best first
    assert report["averaged_from"] == [best, str(tmp_path / "checkpoints" / "epoch=2.ckpt")]
    grid = [(1, 0.6), (4, 0.6), (4, 1.0)]
    assert calls[:2] == [
        ("epoch=1.ckpt", "valid", 1, 1.0, 77),
        ("avg_best2.ckpt", "valid", 1, 1.0, 77),
    ]
    assert report["chosen_model"] == "average"  # valid greedy 40 against 30
    assert calls[2:4] == [("avg_best2.ckpt", "valid", b, a, 77) for b, a in grid[1:]]
    assert [g["bleu"] for g in report["valid_grid"]] == [40.0, 43.0, 41.0]
    assert report["chosen"]["beam_size"] == 4 and report["chosen"]["length_penalty"] == 0.6
    expected = {
        model: {
            "greedy": {"bleu": bleu(name, "test", 1, 1.0), "chrf": bleu(name, "test", 1, 1.0) + 10},
            "chosen": {"bleu": bleu(name, "test", 4, 0.6), "chrf": bleu(name, "test", 4, 0.6) + 10},
        }
        for model, name in (("best", "epoch=1.ckpt"), ("average", "avg_best2.ckpt"))
    }
    assert expected["best"]["greedy"]["bleu"] == 35.0
    assert expected["average"]["chosen"]["bleu"] == 48.0
    assert report["test"] == expected
    assert json.loads((tmp_path / "scores.json").read_text())["test"] == expected
    assert summary_lines(report) == [
        "model chosen on valid: average (greedy BLEU average 40.00, best checkpoint 30.00)",
        "chosen on valid: beam 4, length penalty 0.6 (valid BLEU 43.00)",
        "test best greedy: BLEU 35.00 chrF 45.00",
        "test best chosen: BLEU 38.00 chrF 48.00",
        "test average greedy: BLEU 45.00 chrF 55.00",
        "test average chosen: BLEU 48.00 chrF 58.00",
        "final test (average, chosen): BLEU 48.00 chrF 58.00",
        f"model to use: {report['average_checkpoint']}",
        f"scores: {tmp_path / 'scores.json'}",
    ]
    metrics = flat_metrics(report)
    assert metrics["final/best/chosen/bleu"] == 38.0
    assert metrics["final/average/greedy/chrf"] == 55.0
    assert (metrics["final/beam_size"], metrics["final/length_penalty"]) == (4, 0.6)


def test_equal_valid_bleu_chooses_the_first_grid_point_and_no_average_uses_best(
    tmp_path, monkeypatch
):
    """Ties on valid go to the first point in grid order; with averaging off the grid is
    decoded with the best checkpoint and test has the best checkpoint only."""
    calls, _ = _stub_decoding(monkeypatch, gain={(2, 0.8): 2.0, (4, 0.8): 2.0, (4, 1.2): 2.0})
    kept = _kept_files(tmp_path)
    best = str(tmp_path / "checkpoints" / "epoch=1.ckpt")
    fin = OmegaConf.create(
        {"average_best": 0, "beam_sizes": [2, 4], "length_penalties": [1.2, 0.8]}
    )
    report = finalize(fin, best_k_models=kept, best=best, corpus=_Corpus(), output_dir=tmp_path)

    assert [g["bleu"] for g in report["valid_grid"]] == [30.0, 32.0, 32.0, 32.0]
    assert report["chosen"]["beam_size"] == 2 and report["chosen"]["length_penalty"] == 0.8
    assert {c[0] for c in calls} == {"epoch=1.ckpt"}
    assert report["average_checkpoint"] is None and set(report["test"]) == {"best"}
    assert not list(tmp_path.rglob("avg_best*.ckpt"))
    assert {c[4] for c in calls} == {4096}  # the default max_tokens


def test_an_average_worse_on_valid_is_not_the_reported_model(tmp_path, monkeypatch):
    """The average scores 25 on valid greedy against the best checkpoint's 30 (averaged with
    early checkpoints): the grid is decoded with the best checkpoint and the final score is
    the best checkpoint's; both models are still scored on test."""
    calls, _ = _stub_decoding(
        monkeypatch, gain={(4, 1.0): 2.0}, base={"avg_best2.ckpt": 25.0, "epoch=1.ckpt": 30.0}
    )
    kept = _kept_files(tmp_path)
    best = str(tmp_path / "checkpoints" / "epoch=1.ckpt")
    fin = OmegaConf.create({"average_best": 2, "beam_sizes": [1, 4], "length_penalties": [1.0]})
    report = finalize(fin, best_k_models=kept, best=best, corpus=_Corpus(), output_dir=tmp_path)

    assert report["chosen_model"] == "best"
    assert {k: v["bleu"] for k, v in report["valid_models"].items()} == {
        "best": 30.0,
        "average": 25.0,
    }
    assert [c[:3] for c in calls if c[1] == "valid"] == [
        ("epoch=1.ckpt", "valid", 1),
        ("avg_best2.ckpt", "valid", 1),
        ("epoch=1.ckpt", "valid", 4),  # the grid, with the best checkpoint
    ]
    assert report["final"] == {
        "model": "best", "decoding": "chosen", "bleu": 37.0, "chrf": 47.0, "checkpoint": best
    }  # fmt: skip
    assert f"model to use: {best}" in summary_lines(report)
    assert report["test"]["average"]["chosen"]["bleu"] == 32.0
    lines = summary_lines(report)
    assert (
        lines[0] == "model chosen on valid: best (greedy BLEU average 25.00, best checkpoint 30.00)"
    )
    assert "final test (best, chosen): BLEU 37.00 chrF 47.00" in lines


def _text_corpus(tmp_path: Path, src: str, tgt: str, stems: list[str]):
    from litmt.data.corpora.parallel import ParallelCorpus

    d = tmp_path / f"{src}-{tgt}"
    d.mkdir()
    for stem in stems:
        (d / f"{stem}.{src}").write_text(f"{stem} source\n", encoding="utf-8")
        (d / f"{stem}.{tgt}").write_text(f"{stem} reference\n", encoding="utf-8")
    return ParallelCorpus(src_lang=src, tgt_lang=tgt, dir=d)


def test_extra_test_sets_use_the_chosen_model_and_skip_absent_ones(tmp_path, monkeypatch, caplog):
    """data.extra_test=[test2017, mscoco2017] on local files where only test2017 exists: it is
    scored with the chosen model (the average) greedy and with the choice, read from its own
    files; mscoco2017 is skipped with a warning naming the missing file."""
    calls, _ = _stub_decoding(monkeypatch, gain={(4, 0.6): 3.0})
    stems = ["train", "valid", "test", "test2017"]
    corpus = _text_corpus(tmp_path, "en", "de", stems)
    seen: list[tuple[str, list[str]]] = []
    real_score = litmt.training.finalize.bleu_on_split

    def spy(translator, split, config, max_tokens):
        seen.append((split.name, split.sources))
        return real_score(translator, split, config, max_tokens)

    monkeypatch.setattr(litmt.training.finalize, "bleu_on_split", spy)
    kept = _kept_files(tmp_path)
    best = str(tmp_path / "checkpoints" / "epoch=1.ckpt")
    fin = OmegaConf.create({"average_best": 2, "beam_sizes": [1, 4], "length_penalties": [0.6]})
    with caplog.at_level("WARNING", logger="litmt.training.finalize"):
        report = finalize(
            fin, best_k_models=kept, best=best, corpus=corpus, output_dir=tmp_path,
            extra_test=["test2017", "mscoco2017"],
        )  # fmt: skip

    extra = report["extra_test"]
    assert extra["test2017"] == {
        "greedy": {"bleu": 41.0, "chrf": 51.0},  # the average (40) on a third split (+1)
        "chosen": {"bleu": 44.0, "chrf": 54.0},
    }
    assert [c for c in calls if c[1] == "test2017"] == [
        ("avg_best2.ckpt", "test2017", 1, 1.0, 4096),
        ("avg_best2.ckpt", "test2017", 4, 0.6, 4096),
    ]
    assert ("test2017", ["test2017 source"]) in seen
    assert set(extra["mscoco2017"]) == {"skipped"}
    assert "mscoco2017.en" in extra["mscoco2017"]["skipped"]["en-de"]
    assert any("mscoco2017" in r.getMessage() for r in caplog.records)
    lines = summary_lines(report)
    assert "extra test test2017 chosen: BLEU 44.00 chrF 54.00" in lines
    assert "extra test mscoco2017 en-de: skipped (not in the data)" in lines
    assert flat_metrics(report)["final/extra/test2017/greedy/bleu"] == 41.0


def test_extra_test_of_a_multilingual_model_scores_the_directions_that_have_it(
    tmp_path, monkeypatch
):
    """en-de has test2017, en-cs does not: test2017 is scored on en-de with its direction
    (per-direction key, the mean over what was found), en-cs is listed as skipped."""
    _stub_decoding(monkeypatch, gain={})
    directions: list[list[tuple[str | None, str | None]]] = []
    real_score = litmt.training.finalize.bleu_on_split

    def spy(translator, split, config, max_tokens):
        if not isinstance(split, litmt.training.finalize.Split):
            directions.append([(s.src_lang, s.tgt_lang) for s in split])
            per = {f"{s.src_lang}-{s.tgt_lang}": real_score(translator, s, config, max_tokens)
                   for s in split}  # fmt: skip
            out = {m: sum(p[m] for p in per.values()) / len(per) for m in ("bleu", "chrf")}
            out.update({f"bleu_{k}": p["bleu"] for k, p in per.items()})
            return out
        return real_score(translator, split, config, max_tokens)

    monkeypatch.setattr(litmt.training.finalize, "bleu_on_split", spy)
    de = _text_corpus(tmp_path, "en", "de", ["valid", "test", "test2017"])
    cs = _text_corpus(tmp_path, "en", "cs", ["valid", "test"])
    kept = _kept_files(tmp_path)
    best = str(tmp_path / "checkpoints" / "epoch=1.ckpt")
    fin = OmegaConf.create({"average_best": 0, "beam_sizes": [], "length_penalties": []})
    report = finalize(
        fin, best_k_models=kept, best=best, corpus=[de, cs], output_dir=tmp_path,
        extra_test=["test2017"],
    )  # fmt: skip

    extra = report["extra_test"]["test2017"]
    assert directions[-1] == [("en", "de")]
    assert extra["greedy"]["bleu_en-de"] == 31.0 and set(extra["skipped"]) == {"en-cs"}
    assert report["final"]["model"] == "best" and report["final"]["decoding"] == "greedy"
    lines = summary_lines(report)
    assert "extra test test2017 greedy en-de: BLEU 31.00" in lines
    assert "extra test test2017 en-cs: skipped (not in the data)" in lines


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "data.extra_test must be a list of split names"),
        (["test2017", " "], "data.extra_test must be a list of split names"),
        (["test2017", "test2017"], "data.extra_test lists a split twice"),
    ],
)
def test_bad_extra_test_is_a_config_error(tmp_path, value, message):
    """The message the user sees (scripts/train.py prints a ConfigError as one line)."""
    from litmt.data.datamodule import TranslationDataModule

    with pytest.raises(ConfigError, match=message):
        TranslationDataModule(dir=str(tmp_path), extra_test=value)


def test_run_with_finalize_off_skips_it(tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    cfg = compose_train(_tiny_run(tmp_path, [], epochs=2), tmp_path)
    assert cfg.finalize.average_best == 0 and list(cfg.finalize.beam_sizes) == []
    metrics = train(cfg)
    assert calls == []
    assert not (tmp_path / "run" / "scores.json").exists()
    assert not list((tmp_path / "run").rglob("avg_best*.ckpt"))
    assert "test/bleu" in metrics and not any(k.startswith("final/") for k in metrics)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["finalize.average_best=5"], "save_top_k"),
        (["finalize.average_best=-1"], ">= 0"),
        (["finalize.beam_sizes=[1,5]"], "go together"),
    ],
)
def test_bad_finalize_config_fails_before_training(tmp_path, overrides, message):
    cfg = compose_train(overrides, tmp_path)  # callbacks.model_checkpoint.save_top_k is 3
    with pytest.raises(ConfigError, match=message):
        check_finalize_config(cfg)


@pytest.mark.parametrize("average_best", [2, 5, 50])
def test_save_top_k_minus_one_keeps_every_checkpoint_so_any_average_best_is_accepted(
    tmp_path, average_best
):
    """``save_top_k: -1`` is Lightning's "keep every checkpoint": not a count below
    ``average_best``, so the check accepts it (a finite save_top_k still caps it)."""
    keep_all = compose_train(
        [f"finalize.average_best={average_best}", "callbacks.model_checkpoint.save_top_k=-1"],
        tmp_path,
    )
    assert keep_all.callbacks.model_checkpoint.save_top_k == -1
    check_finalize_config(keep_all)  # no ConfigError
    enough = compose_train(
        [f"finalize.average_best={average_best}",
         f"callbacks.model_checkpoint.save_top_k={average_best}"],
        tmp_path,
    )  # fmt: skip
    check_finalize_config(enough)
    too_few = compose_train(
        [f"finalize.average_best={average_best}",
         f"callbacks.model_checkpoint.save_top_k={average_best - 1}"],
        tmp_path,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=f"save_top_k={average_best - 1} keeps fewer"):
        check_finalize_config(too_few)


def test_the_average_uses_the_top_k_at_the_end_not_the_one_saved_inside_best(tmp_path):
    """Validation BLEU is scripted (probe_callbacks.ScriptedScorer): best at validation 2, then
    4 and 5 push validations 1 and 3 out of the top 3. The test stage restores the callbacks
    from `best`, whose own top-k list ({1, 2}) is stale; the average must still be 2 + 4 + 5."""
    quality = [0.3, 0.9, 0.5, 0.8, 0.7]
    cfg = compose_train(
        _tiny_run(
            tmp_path,
            [
                "callbacks.bleu._target_=probe_callbacks.ScriptedScorer",
                f"+callbacks.bleu.quality=[{','.join(map(str, quality))}]",
                "finalize.average_best=3",
            ],
            epochs=len(quality),
        ),
        tmp_path,
    )
    metrics = train(cfg)
    report = json.loads((tmp_path / "run" / "scores.json").read_text())
    steps = [load_checkpoint(p)["global_step"] for p in report["averaged_from"]]
    last_step = load_checkpoint(metrics["last_checkpoint"])["global_step"]
    per_epoch = last_step // len(quality)
    assert steps == [2 * per_epoch, 4 * per_epoch, 5 * per_epoch]  # best first
    assert report["best_checkpoint"] == report["averaged_from"][0]


RUN_FINALIZE = {
    "average_best": 3,
    "beam_sizes": [1, 3],
    "length_penalties": [0.8, 1.2],
    "max_tokens": 123,
    "record": None,
}


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        ([], {}),
        (["finalize.average_best=2"], {"average_best": 2}),
        (["finalize.beam_sizes=[1,5]"], {"beam_sizes": [1, 5]}),
        (["finalize.length_penalties=[1.0]"], {"length_penalties": [1.0]}),
        (["finalize.max_tokens=64", "data_dir=/moved/corpus"], {"max_tokens": 64}),
        (["extra_test=[test2017,mscoco2017]"], {}),
        (["finalize.record=rerun_id"], {"record": "rerun_id"}),
    ],
)
def test_rerun_keeps_the_runs_finalize_keys_the_command_line_does_not_set(
    tmp_path, monkeypatch, overrides, changed
):
    """scripts/finalize.py's config (conf/finalize.yaml: every finalize key null) on a run saved
    with non-default finalize keys: the end step gets the run's value of every key the command
    line leaves null, the best kept checkpoint, and the run's data unless data_dir moves it."""
    monkeypatch.chdir(tmp_path)  # where finalize.record writes docs/results/records/
    run = tmp_path / "run"
    saved = compose_train(
        [
            "data.dir=/run/corpus",
            *(f"finalize.{k}={'null' if v is None else v}" for k, v in RUN_FINALIZE.items()),
        ],
        tmp_path,
    )
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(saved, run / ".hydra" / "config.yaml")
    kept = _kept_files(run)
    gone = str(run / "checkpoints" / "gone.ckpt")
    kept.update({gone: 99.0})  # deleted since: not a candidate
    callbacks = {"ModelCheckpoint{'monitor': 'valid/bleu'}": {"best_k_models": kept}}
    # the least litmt checkpoint load_checkpoint (the one safe reader) accepts, with the state
    last = {"state_dict": {}, META_KEY: {"format": FORMAT_VERSION}, "callbacks": callbacks}
    torch.save(last, run / "checkpoints" / "last.ckpt")
    got: dict = {}

    def fake_finalize(fin, **kwargs):
        got.update(fin=OmegaConf.to_container(fin), **kwargs)
        return {"test": {}}

    class FakeDataModule:
        def __init__(self, data_cfg):
            self.extra_test = list(data_cfg.get("extra_test") or [])

        def scored_corpora(self):
            return "the corpus"

    def fake_instantiate(data_cfg):
        got["data_dir"] = data_cfg.dir
        return FakeDataModule(data_cfg)

    monkeypatch.setattr(litmt.cli.finalize, "finalize", fake_finalize)
    monkeypatch.setattr(litmt.cli.finalize, "instantiate", fake_instantiate)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("finalize", overrides=[f"run_dir={run}", *overrides])
    assert set(cfg.finalize) == set(RUN_FINALIZE)  # the test covers every key
    finalize_run(cfg)

    assert got["fin"] == {**RUN_FINALIZE, **changed}
    assert got["best"] == str(run / "checkpoints" / "epoch=1.ckpt")
    assert got["best_k_models"] == {k: v for k, v in kept.items() if k != gone}
    assert got["corpus"] == "the corpus" and got["output_dir"] == run
    moved = "data_dir=/moved/corpus" in overrides
    assert got["data_dir"] == ("/moved/corpus" if moved else "/run/corpus")
    extra = "extra_test=[test2017,mscoco2017]" in overrides
    assert got["extra_test"] == (["test2017", "mscoco2017"] if extra else [])
    # finalize.record=ID writes the run's result record (relative to the working directory)
    record = tmp_path / "docs" / "results" / "records" / "rerun_id.json"
    assert record.is_file() == ("record" in changed)


def _finalize_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/finalize.py", *args],
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_finalize_script_reruns_the_end_step_on_a_finished_run(tmp_path):
    """scripts/train.py saving a finalize block (a 2-best average and a grid) but stopping
    before the end step (test_after_training=false), then scripts/finalize.py on its run
    directory with one grid key changed: the run's other keys still apply; the average is of
    the two kept checkpoints with the highest valid BLEU (from last.ckpt), the choice is made
    on valid, the lines are printed."""
    saved = [
        "callbacks.model_checkpoint.save_top_k=3",
        "test_after_training=false",
        "finalize.average_best=2",
        "finalize.beam_sizes=[1,2]",
        "finalize.length_penalties=[1.0]",
    ]
    res = run_train_script(_tiny_run(tmp_path, saved))
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "run"
    assert not (run / "scores.json").exists()
    kept = _kept_scores(str(run / "checkpoints" / "last.ckpt"))
    res = _finalize_script(f"run_dir={run}", "finalize.length_penalties=[0.6]")
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((run / "scores.json").read_text())
    assert report["averaged_from"] == sorted(kept, key=kept.get, reverse=True)[:2]
    assert report["best_checkpoint"] == report["averaged_from"][0]
    assert [(g["beam_size"], g["length_penalty"]) for g in report["valid_grid"]] == [
        (1, 0.6),
        (2, 0.6),
    ]
    lines = res.stdout.splitlines()
    assert any(line.startswith("chosen on valid: beam ") for line in lines)
    s = report["test"]["average"]["chosen"]
    assert f"test average chosen: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}" in lines


def test_finalize_script_errors_are_one_line(tmp_path):
    res = _finalize_script()
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == "error: run_dir is required: python scripts/finalize.py run_dir=RUN_DIR"
    )
    res = _finalize_script(f"run_dir={tmp_path}")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {tmp_path / '.hydra' / 'config.yaml'} not found: run_dir must be a training "
        "run (the run's saved config)"
    ]


def test_kept_checkpoints_read_last_ckpt_through_the_safe_loader(tmp_path):
    """finalize reads last.ckpt with `load_checkpoint`: a file that is not a litmt checkpoint
    is a one-line CheckpointError, not a KeyError from raw torch.load."""
    from litmt.errors import CheckpointError

    last = tmp_path / "last.ckpt"
    torch.save({"callbacks": {}}, last)
    with pytest.raises(CheckpointError, match=r"last\.ckpt is not a litmt checkpoint"):
        litmt.cli.finalize.kept_checkpoints(last)


def test_a_multilingual_run_is_scored_on_every_direction(tmp_path):
    """`scored_corpora` (what train and scripts/finalize.py hand to finalize): one corpus per
    direction, each with its languages; a one-pair datamodule gives its one corpus."""
    from litmt.data.datamodule import TranslationDataModule

    multi = TranslationDataModule(dir=str(tmp_path), directions=["en-de", "en-fr", "en-cs"])
    corpora = multi.scored_corpora()
    assert [(c.src_lang, c.tgt_lang) for c in corpora] == [("en", "de"), ("en", "fr"), ("en", "cs")]
    one = TranslationDataModule(dir=str(tmp_path), src_lang="de", tgt_lang="en")
    assert one.scored_corpora() is one.corpus
