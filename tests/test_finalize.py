"""The end of a training run (`litmt.finalize`): the average of the best checkpoints, the
beam/length-penalty choice made on valid only, and the test scores in scores.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_utils import (
    REPO,
    compose_train,
    run_train_script,
    script_env,
    tiny_overrides,
    write_toy_corpus,
)

import litmt.finalize
from litmt.checkpoint import load_checkpoint, model_state_dict
from litmt.errors import ConfigError
from litmt.finalize import check_finalize_config
from litmt.train import train

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


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, float, float]]:
    """Record (split, beam size, length penalty, BLEU) of every decode+score call."""
    calls: list[tuple[str, int, float, float]] = []
    real = litmt.finalize.score_split

    def spy(translator, split, config, max_tokens):
        scores = real(translator, split, config, max_tokens)
        calls.append((split.name, config.beam_size, config.length_penalty, scores["bleu"]))
        return scores

    monkeypatch.setattr(litmt.finalize, "score_split", spy)
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
    assert [(s, b, a) for s, b, a, _ in calls[:3]] == [("valid", b, a) for b, a in grid]
    assert [g["bleu"] for g in report["valid_grid"]] == [c[3] for c in calls[:3]]
    best_point = max(calls[:3], key=lambda c: c[3])
    chosen = report["chosen"]
    assert (chosen["beam_size"], chosen["length_penalty"]) == best_point[1:3]
    # then test: best and average, each greedy and with the choice, and nothing else
    assert [c[:3] for c in calls[3:]] == [("test", 1, 1.0), ("test", *best_point[1:3])] * 2
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
                "callbacks.scorer._target_=probe_callbacks.ScriptedScorer",
                f"+callbacks.scorer.quality=[{','.join(map(str, quality))}]",
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
    """scripts/train.py with finalize off, then scripts/finalize.py on its run directory with
    a 2-best average and a grid: the average is of the two kept checkpoints with the highest
    valid BLEU (from last.ckpt), the choice is made on valid, the lines are printed."""
    res = run_train_script(_tiny_run(tmp_path, ["callbacks.model_checkpoint.save_top_k=3"]))
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "run"
    assert not (run / "scores.json").exists()
    kept = _kept_scores(str(run / "checkpoints" / "last.ckpt"))
    res = _finalize_script(
        f"run_dir={run}",
        "finalize.average_best=2",
        "finalize.beam_sizes=[1,2]",
        "finalize.length_penalties=[1.0]",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((run / "scores.json").read_text())
    assert report["averaged_from"] == sorted(kept, key=kept.get, reverse=True)[:2]
    assert report["best_checkpoint"] == report["averaged_from"][0]
    assert [(g["beam_size"], g["length_penalty"]) for g in report["valid_grid"]] == [
        (1, 1.0),
        (2, 1.0),
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
