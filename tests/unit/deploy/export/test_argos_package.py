"""format=argos: the Argos Translate package zip (layout Argos's install_from_path and Package
read), its metadata, the refusal of separate vocabularies, a multilingual package's
sentencepiece model that decodes its language token to nothing, and format=ct2 unchanged.
The real Argos on a multilingual package: tests/integration/export/test_argos_multilingual.py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

import sentencepiece as spm
from tiny_checkpoint import (
    build_tiny_multilingual_checkpoint,
    corpus,
    tiny_checkpoint_path,
    tiny_config,
)

from litmt.checkpoint.io import save_model_checkpoint
from litmt.checkpoint.load import load_model
from litmt.data.tokenization.segmentation import model_proto
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.deploy.export.ct2 import is_export_dir
from litmt.models import Seq2SeqTransformer

REPO = Path(__file__).resolve().parents[4]


def export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export.py"), *args],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint_path(tmp_path_factory)


def test_argos_package_layout_and_metadata(ckpt, tmp_path):
    out = tmp_path / "en-de.argosmodel"
    run = export(f"ckpt_path={ckpt}", f"out={out}", "format=argos", "argos.from_name=English")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        root = "translate-en_de-1_0"
        assert {f"{root}/metadata.json", f"{root}/sentencepiece.model"} <= names
        assert {f"{root}/model/model.bin", f"{root}/model/config.json"} <= names
        assert {n.split("/")[0] for n in names} == {root}  # one package directory
        meta = json.loads(z.read(f"{root}/metadata.json"))
        z.extractall(tmp_path / "x")
    assert meta == {
        "package_version": "1.0", "argos_version": "1.9", "from_code": "en",
        "from_name": "English", "to_code": "de", "to_name": "de", "type": "translate",
        "links": [],
    }  # fmt: skip
    assert is_export_dir(tmp_path / "x" / root / "model")
    sp = (tmp_path / "x" / root / "sentencepiece.model").read_bytes()
    assert sp == load_model(ckpt).tokenizer.src_model_bytes  # the joint model, both sides


def test_a_multilingual_package_decodes_its_language_token_to_nothing(tmp_path):
    """Argos joins a paragraph's sentences' pieces, each headed by the forced ``<2fr>``, and
    decodes them with the package's sentencepiece model: there the tags are control pieces
    (decoded to nothing), with the pieces, ids and source segmentation of the checkpoint's."""
    from litmt.deploy.export.argos import export_argos_package

    path = build_tiny_multilingual_checkpoint(tmp_path, "target")
    settings = {"package_version": "1.0", "argos_version": "1.11", "tgt_lang": "fr"}
    out = export_argos_package(path, tmp_path / "en-fr.argosmodel", settings)
    root = "translate-en_fr-1_0"
    with zipfile.ZipFile(out) as z:
        assert json.loads(z.read(f"{root}/metadata.json"))["target_prefix"] == "<2fr>"
        package = z.read(f"{root}/sentencepiece.model")
    model = load_model(path).tokenizer.src_model_bytes
    ours, theirs = model_proto(package).pieces, model_proto(model).pieces
    assert [(p.piece, p.score) for p in ours] == [(p.piece, p.score) for p in theirs]
    control = type(model_proto(package)).SentencePiece.CONTROL
    changed = {p.piece: p.type for p, q in zip(ours, theirs, strict=True) if p.type != q.type}
    assert changed == {"<2de>": control, "<2fr>": control}
    sp = spm.SentencePieceProcessor(model_proto=package)
    text = "A red dog runs. A small cat sleeps here."
    assert sp.encode(text) == spm.SentencePieceProcessor(model_proto=model).encode(text)
    sentence = sp.encode("Un chien court.", out_type=str)
    joined = sp.decode_pieces(["<2fr>", *sentence, "<2fr>", *sentence])  # as Argos decodes
    assert joined == "Un chien court. Un chien court.", joined


def test_separate_vocabularies_are_refused_with_one_line(tmp_path):
    en, de = corpus()
    tok = Tokenizer.train(en, de, TokenizerConfig(vocab_size=60, joint=False))
    config = tiny_config(tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                         share_embeddings=False, d_model=32, d_ff=64)  # fmt: skip
    path = save_model_checkpoint(tmp_path / "sep.ckpt", Seq2SeqTransformer(config), tok, "en", "de")
    out = tmp_path / "sep.argosmodel"
    run = export(f"ckpt_path={path}", f"out={out}", "format=argos")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "separate source and target" in lines[0], run.stderr
    assert not out.exists() and not list(tmp_path.glob(".sep.argosmodel.*"))


def test_default_format_is_still_a_ct2_directory(ckpt, tmp_path):
    out = tmp_path / "ct2"
    run = export(f"ckpt_path={ckpt}", f"out={out}")
    assert run.returncode == 0, run.stderr
    assert is_export_dir(out) and (out / "src.model").is_file()
    bad = export(f"ckpt_path={ckpt}", f"out={tmp_path / 'x'}", "format=tflite")
    assert bad.returncode == 2 and "unknown format 'tflite'" in bad.stderr
