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

    # the grid is decoded on valid only, every point once, before test is touched
    # (greedy once: the length penalty does not change its output)
    grid = [(1, 0.6), (2, 0.6), (2, 1.0)]
    average, best = report["average_checkpoint"], report["best_checkpoint"]
    assert [(s, b, a, m) for s, b, a, _, m in calls[:3]] == [
        ("valid", b, a, average) for b, a in grid
    ]  # with the average
    assert [g["bleu"] for g in report["valid_grid"]] == [c[3] for c in calls[:3]]
    best_point = max(calls[:3], key=lambda c: c[3])
    chosen = report["chosen"]
    assert (chosen["beam_size"], chosen["length_penalty"]) == best_point[1:3]
    # then test: best and average, each greedy and with the choice, and nothing else; each
    # model's scores come from decoding that model's checkpoint
    decodings = [(1, 1.0), best_point[1:3]]
    assert [(c[0], *c[1:3], c[4]) for c in calls[3:]] == [
        ("test", *d, ckpt) for ckpt in (best, average) for d in decodings
    ]
    for (_, _, _, bleu, ckpt), decoding in zip(calls[3:], ["greedy", "chosen"] * 2, strict=True):
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

    # the final lines the user reads: the choice with its valid BLEU, then the four test scores
    printed = capsys.readouterr().out.splitlines()
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


def _stub_decoding(monkeypatch: pytest.MonkeyPatch, gain: dict[tuple[int, float], float]):
    """Replace averaging, loading and decode+score by stubs: every checkpoint scores its own
    BLEU (avg_best2.ckpt 40, epoch=1 30, else 20), + 5 on test, + `gain` at (beam, penalty).
    Returns the calls: (checkpoint name, split, beam size, length penalty, max_tokens)."""
    calls: list[tuple[str, str, int, float, int]] = []

    class Loaded:
        def __init__(self, path: str) -> None:
            self.name = Path(path).name

        @classmethod
        def from_checkpoint(cls, path: str) -> Loaded:
            return cls(path)

    def bleu(name: str, split: str, beam: int, alpha: float) -> float:
        base = {"avg_best2.ckpt": 40.0, "epoch=1.ckpt": 30.0}.get(name, 20.0)
        return base + (5.0 if split == "test" else 0.0) + gain.get((beam, alpha), 0.0)

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
    assert calls[:3] == [("avg_best2.ckpt", "valid", b, a, 77) for b, a in grid]
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
        "chosen on valid: beam 4, length penalty 0.6 (valid BLEU 43.00)",
        "test best greedy: BLEU 35.00 chrF 45.00",
        "test best chosen: BLEU 38.00 chrF 48.00",
        "test average greedy: BLEU 45.00 chrF 55.00",
        "test average chosen: BLEU 48.00 chrF 58.00",
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
}


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        ([], {}),
        (["finalize.average_best=2"], {"average_best": 2}),
        (["finalize.beam_sizes=[1,5]"], {"beam_sizes": [1, 5]}),
        (["finalize.length_penalties=[1.0]"], {"length_penalties": [1.0]}),
        (["finalize.max_tokens=64", "data_dir=/moved/corpus"], {"max_tokens": 64}),
    ],
)
def test_rerun_keeps_the_runs_finalize_keys_the_command_line_does_not_set(
    tmp_path, monkeypatch, overrides, changed
):
    """scripts/finalize.py's config (conf/finalize.yaml: every finalize key null) on a run saved
    with non-default finalize keys: the end step gets the run's value of every key the command
    line leaves null, the best kept checkpoint, and the run's data unless data_dir moves it."""
    run = tmp_path / "run"
    saved = compose_train(
        ["data.dir=/run/corpus", *(f"finalize.{k}={v}" for k, v in RUN_FINALIZE.items())],
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

    def fake_instantiate(data_cfg):
        got["data_dir"] = data_cfg.dir
        return type("DataModule", (), {"corpus": "the corpus"})()

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


def _finalize_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/finalize.py", *args],
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


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
