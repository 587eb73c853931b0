"""evaluate(cfg), checkpoint selection/averaging and the sacreBLEU wrapper (in process)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import sacrebleu
import torch
from hydra import compose, initialize_config_dir
from tiny_checkpoint import (
    assert_weights_are_the_mean,
    corpus,
    mean_weights,
    other_weights,
    save_weights,
    tiny_checkpoint_path,
)

from litmt.checkpoint.average import average_checkpoints
from litmt.checkpoint.io import load_checkpoint, model_state_dict
from litmt.checkpoint.paths import select_last_checkpoints
from litmt.cli.evaluate import evaluate
from litmt.cli.script.config_check import expand_short_overrides
from litmt.errors import CheckpointError, ConfigError, DataError
from litmt.metrics import corpus_bleu, corpus_scores

CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return tiny_checkpoint_path(tmp_path_factory)


def compose_cfg(name: str, overrides: list[str]):
    """The config the script composes (the short form beam_size=2 expanded first, as run_script)."""
    overrides = expand_short_overrides(overrides, name, CONF)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def perturbed_refs(refs: list[str]) -> list[str]:
    """References that differ from a perfect output in every third sentence."""
    return [r.replace("Ein", "Der") if i % 3 == 0 else r for i, r in enumerate(refs)]


@pytest.fixture
def test_files(tmp_path):
    en, de = corpus(seed=5)
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("\n".join(en[:24]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(perturbed_refs(de[:24])) + "\n", encoding="utf-8")
    return src, ref


def test_metrics_are_sacrebleu_with_signatures():
    hyps = ["Ein Hund rennt.", "Eine Katze schläft hier."]
    refs = ["Ein Hund rennt draußen.", "Die Katze schläft hier."]
    got = corpus_scores(hyps, refs)
    assert got["bleu"].score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert got["chrf"].score == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert got["ter"].score == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score)
    assert got["bleu"].signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert got["chrf"].line.startswith("chrF2|nrefs:1|")
    assert got["ter"].line.startswith("TER|nrefs:1|")
    assert corpus_bleu(hyps, refs) == got["bleu"].score
    two = corpus_scores(hyps, [refs, hyps])  # two reference streams
    assert two["bleu"].signature.startswith("nrefs:2") and two["bleu"].score == pytest.approx(100)
    with pytest.raises(DataError, match="2 hypotheses but reference stream 1 has 1 lines"):
        corpus_scores(hyps, refs[:1])


def test_evaluate_on_files_matches_sacrebleu_on_its_hypotheses(ckpt, test_files, tmp_path, capsys):
    src, ref = test_files
    hyp, scores = tmp_path / "out" / "test.hyp", tmp_path / "out" / "scores.json"
    cfg = compose_cfg(
        "evaluate",
        [
            f"ckpt_path={ckpt}",
            f"src_file={src}",
            f"ref_file={ref}",
            f"hyp_file={hyp}",
            f"scores_file={scores}",
            "beam_size=3",
            "progress=false",
        ],
    )
    result = evaluate(cfg)
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = ref.read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 24
    independent = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert result["bleu"] == pytest.approx(independent)
    assert 20 < independent < 100  # the perturbed references keep the score informative
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert result["ter"] == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score)
    out = capsys.readouterr().out.splitlines()
    assert [line.split("|")[0] for line in out] == ["BLEU", "chrF2", "TER"]
    assert out[0].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert f"= {independent:.2f} " in out[0]
    report = json.loads(scores.read_text())
    assert report["scores"]["bleu"]["score"] == pytest.approx(independent)
    assert report["scores"]["ter"]["signature"].startswith("nrefs:1|case:lc|tok:tercom")
    assert report["n_sentences"] == 24 and report["checkpoints"] == [str(ckpt)]
    assert report["decoding"]["beam_size"] == 3


def test_evaluate_reads_any_data_config_and_split(ckpt, tmp_path):
    en, de = corpus(seed=6)
    data = tmp_path / "corpus"
    data.mkdir()
    for split, (a, b) in {"train": (0, 30), "valid": (30, 40), "test": (40, 52)}.items():
        (data / f"{split}.en").write_text("\n".join(en[a:b]) + "\n", encoding="utf-8")
        (data / f"{split}.de").write_text("\n".join(de[a:b]) + "\n", encoding="utf-8")
    hyp = tmp_path / "valid.hyp"
    cfg = compose_cfg(
        "evaluate",
        [
            f"ckpt_path={ckpt}",
            "data=local",
            f"data.dir={data}",
            f"paths.data_dir={tmp_path / 'cache'}",
            "split=valid",
            f"hyp_file={hyp}",
            "beam_size=2",
            "progress=false",
        ],
    )
    result = evaluate(cfg)
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 10
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [de[30:40]]).score)


def test_evaluate_with_a_list_of_checkpoints_decodes_with_their_mean(ckpt, test_files, tmp_path):
    """`ckpt_path=[A,B]` scores exactly like a checkpoint holding the hand-computed mean of A
    and B, and unlike A alone or A + B (the two plausible averaging bugs)."""
    src, ref = test_files
    other = other_weights(ckpt, tmp_path / "other.ckpt", seed=1)
    mean = mean_weights([ckpt, other])
    by_hand = save_weights(ckpt, mean, tmp_path / "mean.ckpt")
    summed = save_weights(ckpt, {k: 2 * v for k, v in mean.items()}, tmp_path / "sum.ckpt")
    base = [f"src_file={src}", f"ref_file={ref}", "beam_size=2", "progress=false"]

    def run(ckpt_path: str, name: str) -> tuple[dict[str, float], list[str]]:
        hyp = tmp_path / f"{name}.hyp"
        scores = evaluate(compose_cfg("evaluate", [ckpt_path, f"hyp_file={hyp}", *base]))
        return scores, hyp.read_text(encoding="utf-8").splitlines()

    averaged = run(f"ckpt_path=[{ckpt},{other}]", "averaged")
    assert averaged == run(f"ckpt_path={by_hand}", "by_hand")
    assert averaged[1] != run(f"ckpt_path={ckpt}", "first")[1]
    assert averaged[1] != run(f"ckpt_path={summed}", "sum")[1]


def test_averaging_three_different_checkpoints_gives_their_mean(ckpt, tmp_path):
    paths = [ckpt, *(other_weights(ckpt, tmp_path / f"o{i}.ckpt", seed=i) for i in (1, 2))]
    out = average_checkpoints(paths, tmp_path / "avg.ckpt")
    assert_weights_are_the_mean(model_state_dict(load_checkpoint(out)), paths)
    assert load_checkpoint(out)["averaged_from"] == [str(p) for p in paths]


def test_averaging_two_different_checkpoints_gives_the_mean(ckpt, tmp_path):
    raw = torch.load(ckpt, weights_only=True)
    other = {**raw, "state_dict": {k: v * 3 for k, v in raw["state_dict"].items()}}
    torch.save(other, tmp_path / "times3.ckpt")
    out = average_checkpoints([ckpt, tmp_path / "times3.ckpt"], tmp_path / "avg.ckpt")
    after = model_state_dict(load_checkpoint(out))
    for k, v in model_state_dict(raw).items():
        torch.testing.assert_close(after[k], 2 * v)


def test_select_last_checkpoints_by_step_and_by_mtime(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for name in ["epoch=0-step=900.ckpt", "epoch=1-step=1000.ckpt", "epoch=0-step=50.ckpt"]:
        (ckpts / name).write_bytes(b"x")
    (ckpts / "last.ckpt").write_bytes(b"x")
    (tmp_path / "run" / "avg_last2.ckpt").write_bytes(b"x")
    got = select_last_checkpoints(tmp_path / "run", 2)
    assert [p.name for p in got] == ["epoch=0-step=900.ckpt", "epoch=1-step=1000.ckpt"]
    plain = tmp_path / "plain"
    plain.mkdir()
    for i, name in enumerate(["c.ckpt", "a.ckpt", "b.ckpt"]):
        (plain / name).write_bytes(b"x")
        os.utime(plain / name, (1000 + i, 1000 + i))
    assert [p.name for p in select_last_checkpoints(plain, 2)] == ["a.ckpt", "b.ckpt"]
    with pytest.raises(ConfigError, match=r"average_last=4 but .* holds 3 checkpoint\(s\)"):
        select_last_checkpoints(plain, 4)


def test_select_last_checkpoints_reads_the_step_of_litmts_own_names(tmp_path):
    """`callbacks.model_checkpoint.filename` writes best-step{step:06d}-bleu{B}: the order is
    the step's, even when the modification times say otherwise (a copied run directory)."""
    names = ["best-step004693-bleu36.68.ckpt", "best-step000247-bleu3.13.ckpt",
             "best-step012000-bleu30.00.ckpt"]  # fmt: skip
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (2000 - i, 2000 - i))  # newest file = lowest step
    got = [p.name for p in select_last_checkpoints(tmp_path, 2)]
    assert got == ["best-step004693-bleu36.68.ckpt", "best-step012000-bleu30.00.ckpt"]


def test_average_last_reaches_the_run_directory(ckpt, test_files, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    other_weights(ckpt, run / "epoch=0-step=10.ckpt", seed=1)  # the oldest: untrained weights
    for step in (20, 30):
        shutil.copy(ckpt, run / f"epoch=0-step={step}.ckpt")
    src, ref = test_files
    scores = tmp_path / "scores.json"
    cfg = compose_cfg(
        "evaluate",
        [
            f"run_dir={run}",
            "average_last=2",
            f"src_file={src}",
            f"ref_file={ref}",
            f"scores_file={scores}",
            "progress=false",
        ],
    )
    assert evaluate(cfg)["bleu"] > 20  # the untrained oldest checkpoint is not in the average
    assert json.loads(scores.read_text())["checkpoints"] == [
        str(run / f"epoch=0-step={step}.ckpt") for step in (20, 30)
    ]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ([], ConfigError, "no checkpoint given: pass ckpt_path=<.ckpt> (or a list)"),
        (["ckpt_path=CKPT", "average_last=2"], ConfigError, "give either ckpt_path"),
        (["average_last=2"], ConfigError, "average_last=N needs run_dir"),
        (["ckpt_path=CKPT"], ConfigError, "no evaluation data: pass src_file=... ref_file=..."),
        (["ckpt_path=CKPT", "src_file=SRC"], ConfigError, "src_file and ref_file go together"),
        (
            ["ckpt_path=CKPT", "src_file=SRC", "ref_file=SHORT"],
            DataError,
            "src_file has 24 lines but ref_file has 2",
        ),
        (["ckpt_path=CKPT", "src_file=SRC", "ref_file=NOPE"], DataError, "ref_file not found"),
        (
            ["ckpt_path=NOPE", "src_file=SRC", "ref_file=REF"],
            CheckpointError,
            "checkpoint not found",
        ),
    ],
)
def test_evaluate_user_errors(ckpt, test_files, tmp_path, overrides, error, message):
    src, ref = test_files
    short = tmp_path / "short.de"
    short.write_text("a\nb\n")
    subst = {"CKPT": ckpt, "SRC": src, "REF": ref, "SHORT": short, "NOPE": tmp_path / "nope"}
    for key, value in subst.items():
        overrides = [o.replace(key, str(value)) if o.endswith(key) else o for o in overrides]
    with pytest.raises(error) as err:
        evaluate(compose_cfg("evaluate", overrides))
    assert message in str(err.value)


def test_src_and_ref_files_follow_the_line_policy(ckpt, test_files, tmp_path):
    """A BOM, CRLF line ends and no final newline (a file saved on Windows) change nothing:
    evaluate reads src_file/ref_file with `litmt.data.text.read_lines`."""
    src, ref = test_files
    windows = []
    for path in (src, ref):
        text = path.read_text(encoding="utf-8").removesuffix("\n").replace("\n", "\r\n")
        out = tmp_path / f"win_{path.name}"
        out.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
        windows.append(out)
    base = ["beam_size=2", "progress=false"]
    plain = evaluate(
        compose_cfg("evaluate", [f"ckpt_path={ckpt}", f"src_file={src}", f"ref_file={ref}", *base])
    )
    again = evaluate(
        compose_cfg(
            "evaluate",
            [f"ckpt_path={ckpt}", f"src_file={windows[0]}", f"ref_file={windows[1]}", *base],
        )
    )
    assert again == plain
