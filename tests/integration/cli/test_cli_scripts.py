"""The scripts end to end: subprocess runs of translate.py / evaluate.py, composed-config runs
of the averaging and heatmap jobs, and the one-line error contract of `litmt.cli.script.runner`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from hydra import compose, initialize_config_dir
from PIL import Image
from tiny_checkpoint import assert_weights_are_the_mean, corpus, other_weights, tiny_checkpoint_path

from litmt import Translator
from litmt.checkpoint.io import load_checkpoint, model_state_dict
from litmt.cli.average import average
from litmt.cli.script.config_check import expand_short_overrides
from litmt.cli.script.exits import cli_errors, run_cli
from litmt.cli.translate import translate
from litmt.cli.visualize import visualize
from litmt.errors import CheckpointError, ConfigError, DataError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return tiny_checkpoint_path(tmp_path_factory)


def run_script(script: str, *overrides: str, stdin: bytes | None = None, cwd: Path = REPO):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *overrides],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def compose_cfg(name: str, overrides: list[str]):
    """The config the script composes (the short form beam_size=2 expanded first, as run_script)."""
    overrides = expand_short_overrides(overrides, name, REPO / "conf")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def test_translate_stdin_keeps_line_alignment_with_bad_input(ckpt, tmp_path):
    long = " ".join(["A big red dog runs outside."] * 40)
    lines = [
        b"A red dog runs.",
        b"",
        b"   \t  ",
        b"A small cat\x00 sleeps\x1b here.",
        b"A big \xff\xfe bird sings.",  # invalid UTF-8
        long.encode(),
        b"",
        b"A young boy walks today.\r",  # CRLF line
        b"A man eats.",  # last line without a newline
    ]
    stdin = b"\n".join(lines)
    proc = run_script("translate.py", f"ckpt_path={ckpt}", "beam_size=2", stdin=stdin, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)  # one line out per line in
    out = out[:-1]
    assert out[1] == out[2] == out[6] == ""
    assert all(out[i] for i in (0, 3, 4, 5, 7, 8))
    expected = Translator.from_checkpoint(ckpt).translate(
        ["A red dog runs.", "A small cat sleeps here.", "A young boy walks today.", "A man eats."],
        beam_size=2,
    )
    assert [out[0], out[3], out[7], out[8]] == expected
    err = proc.stderr.decode()
    assert "warning: line 4: removed 2 control character(s)" in err
    assert re.search(
        r"warning: line 6: \d+ subword tokens, truncated to the model's maximum of 48", err
    )
    assert "line 8" not in err  # a CRLF ending is not a control character
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no outputs/ or .hydra/ left behind


def test_translate_arguments_nbest_and_output_file(ckpt, tmp_path, capsys):
    out = tmp_path / "sub" / "nbest.txt"
    cfg = compose_cfg(
        "translate",
        [
            f"ckpt_path={ckpt}",
            'text=["A red dog runs.", "", "A big cat eats here."]',
            "beam_size=3",
            "n_best=2",
            f"output={out}",
        ],
    )
    assert translate(cfg) == 3
    assert capsys.readouterr().out == ""
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1", "2", "2"]
    assert rows[2] == ["1", "0.0000", ""] and rows[3] == ["1", "-inf", ""]
    for i in (0, 4):
        assert float(rows[i][1]) >= float(rows[i + 1][1])
        assert rows[i][2] and rows[i][2] != rows[i + 1][2]


def test_translate_job_user_errors(ckpt, tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint given: pass ckpt_path="):
        translate(compose_cfg("translate", []))
    with pytest.raises(ConfigError, match="n_best=3 needs beam_size >= 3"):
        translate(compose_cfg("translate", [f"ckpt_path={ckpt}", "beam_size=2", "n_best=3"]))
    with pytest.raises(DataError, match=r"input file not found: .*nope\.txt"):
        translate(compose_cfg("translate", [f"ckpt_path={ckpt}", f"input={tmp_path}/nope.txt"]))
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        translate(compose_cfg("translate", [f"ckpt_path={tmp_path}/nope.ckpt", "text=A dog."]))


@pytest.mark.slow
def test_translate_missing_checkpoint_is_one_line_exit_2(tmp_path):
    proc = run_script("translate.py", f"ckpt_path={tmp_path / 'missing.ckpt'}", stdin=b"A dog.\n")
    assert proc.returncode == 2
    assert proc.stdout == b""
    err = proc.stderr.decode().strip().splitlines()
    assert err == [
        f"error: checkpoint not found: {tmp_path / 'missing.ckpt'} (pass ckpt_path=<path to a .ckpt file>)"
    ]


def test_evaluate_cli_contract_prints_the_bleu_sacrebleu_computes(ckpt, tmp_path):
    en, de = corpus(seed=7)
    src, ref, hyp = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "out.txt"
    src.write_text("\n".join(en[:20]) + "\n", encoding="utf-8")
    refs = [r.replace("Ein", "Der") if i % 2 else r for i, r in enumerate(de[:20])]
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    proc = run_script(
        "evaluate.py",
        f"ckpt_path={ckpt}",
        f"src_file={src}",
        f"ref_file={ref}",
        f"hyp_file={hyp}",
        "beam_size=5",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    stdout = proc.stdout.decode()
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    printed = re.search(r"^BLEU\|(\S+) = ([\d.]+) ", stdout, re.M)
    assert printed, stdout
    assert float(printed[2]) == pytest.approx(bleu.score, abs=0.005)
    assert 10 < bleu.score < 100
    assert printed[1].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    chrf = re.search(r"^chrF2\|nrefs:1\|\S+ = ([\d.]+)$", stdout, re.M)
    ter = re.search(r"^TER\|nrefs:1\|\S+ = ([\d.]+)$", stdout, re.M)
    assert chrf and float(chrf[1]) == pytest.approx(
        sacrebleu.corpus_chrf(hyps, [refs]).score, abs=0.005
    )
    assert ter and float(ter[1]) == pytest.approx(
        sacrebleu.corpus_ter(hyps, [refs]).score, abs=0.005
    )
    assert "20/20 [" in proc.stderr.decode()  # the progress bar


def test_average_job_writes_the_mean_of_two_different_checkpoints(ckpt, tmp_path):
    other = other_weights(ckpt, tmp_path / "other.ckpt", seed=1)
    out = tmp_path / "avg.ckpt"
    average(compose_cfg("average_checkpoints", [f"ckpt_path=[{ckpt},{other}]", f"output={out}"]))
    assert_weights_are_the_mean(model_state_dict(load_checkpoint(out)), [ckpt, other])
    with pytest.raises(ConfigError, match="nothing to average"):
        average(compose_cfg("average_checkpoints", [f"output={out}"]))


@pytest.mark.parametrize("grid", [False, True])
def test_heatmap_job_writes_pngs_of_the_expected_size(ckpt, tmp_path, grid):
    out = tmp_path / "attn.png"
    cfg = compose_cfg(
        "visualize_attention",
        [
            f"ckpt_path={ckpt}",
            "sentence=A big dog sleeps outside.",
            "kind=[cross,encoder,decoder]" if not grid else "kind=[cross,decoder]",
            f"grid={str(grid).lower()}",
            "layers=[0,1]",
            "heads=[0,2]",
            "figsize=[8,6]",
            "dpi=40",
            f"out={out}",
        ],
    )
    written = visualize(cfg)
    kinds = ["cross", "decoder"] if grid else ["cross", "encoder", "decoder"]
    assert [p.name for p in written] == [f"attn_{k}.png" for k in kinds]
    for p in written:
        with Image.open(p) as img:
            assert img.size == (320, 240)


@pytest.mark.slow
def test_heatmap_and_average_scripts_in_a_subprocess(ckpt, tmp_path):
    proc = run_script(
        "visualize_attention.py",
        f"ckpt_path={ckpt}",
        "sentence=A red cat sings.",
        "figsize=[5,4]",
        "dpi=50",
        f"out={tmp_path / 'a.png'}",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    with Image.open(tmp_path / "a.png") as img:
        assert img.size == (250, 200)
    other = other_weights(ckpt, tmp_path / "other.ckpt", seed=1)
    out = tmp_path / "avg.ckpt"
    proc = run_script("average_checkpoints.py", f"ckpt_path=[{ckpt},{other}]", f"output={out}")
    assert proc.returncode == 0, proc.stderr.decode()
    assert_weights_are_the_mean(model_state_dict(load_checkpoint(out)), [ckpt, other])


def test_cli_errors_print_one_line_and_exit_2(capsys):
    @run_cli
    def job() -> None:
        raise ConfigError("beam_size must be at least 1, got 0\nsecond line is dropped")

    with pytest.raises(SystemExit) as exit_info:
        job()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: beam_size must be at least 1, got 0\n"
    assert job.__wrapped__ is not None  # Hydra unwraps it to find the script's conf dir
    with pytest.raises(ZeroDivisionError), cli_errors():  # bugs keep their traceback
        _ = 1 / 0
