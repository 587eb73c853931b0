"""``translate.py``, ``evaluate.py`` and ``score.py`` take the direction of a multilingual
model (``src_lang=``/``tgt_lang=``), run as subprocesses: the output equals the Python API's,
and an unknown direction is one ``error:`` line and exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import build_tiny_multilingual_checkpoint
from train_utils import script_env

from litmt.decoding.translator import Translator

REPO = Path(__file__).resolve().parents[3]
EN = ["A red dog runs.", "A small cat sleeps here."]


@pytest.fixture(scope="module")
def multi_ckpt(tmp_path_factory) -> Path:
    return build_tiny_multilingual_checkpoint(tmp_path_factory.mktemp("multi_cli"), "target")


def _run(script: str, *overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / f"{script}.py"), *overrides],
        capture_output=True, cwd=cwd, env=script_env(), timeout=300, text=True,
    )  # fmt: skip


def test_the_tools_take_the_direction(multi_ckpt: Path, tmp_path: Path) -> None:
    (tmp_path / "src.en").write_text("\n".join(EN) + "\n", encoding="utf-8")
    want = Translator.from_checkpoint(multi_ckpt, device="cpu").translate(
        EN, tgt_lang="fr", beam_size=1
    )
    (tmp_path / "ref.fr").write_text("\n".join(want) + "\n", encoding="utf-8")
    ckpt = f"ckpt_path={multi_ckpt}"
    r = _run("translate", ckpt, "input=src.en", "tgt_lang=fr", "beam_size=1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == want
    r = _run(
        "evaluate", ckpt, "src_file=src.en", "ref_file=ref.fr", "tgt_lang=fr", "beam_size=1",
        "scores_file=scores.json", "progress=false", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "scores.json").read_text())
    assert report["direction"] == "en-fr" and report["zero_shot"] is False
    assert report["scores"]["bleu"]["score"] == pytest.approx(100.0)
    r = _run("score", ckpt, "src_file=src.en", "tgt_file=ref.fr", "tgt_lang=fr", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize("script", ["translate", "evaluate", "score"])
def test_an_unknown_direction_is_one_line(multi_ckpt: Path, tmp_path: Path, script: str) -> None:
    (tmp_path / "a.en").write_text("A dog.\n", encoding="utf-8")
    files = {
        "translate": ["input=a.en"],
        "evaluate": ["src_file=a.en", "ref_file=a.en"],
        "score": ["src_file=a.en", "tgt_file=a.en"],
    }[script]
    r = _run(script, f"ckpt_path={multi_ckpt}", *files, "tgt_lang=es", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: this model translates en-de, en-fr, not en-es"
    )
