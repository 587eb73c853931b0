"""format=hf: the export loads with transformers alone (AutoModelForSeq2SeqLM, AutoTokenizer,
pipeline("translation")) and computes litmt's model: logits within 1e-4, the same greedy
output, the same tokenizer ids; export -> import round-trips; unmappable models are refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("transformers")

from tiny_checkpoint import build_tiny_checkpoint, corpus

from benchmarks.hf_models import make_marian_dir
from checks.hf_parity import hf_translate
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.load import load_model
from litmt.cli.import_hf import import_hf
from litmt.decoding.translator import Translator
from litmt.deploy.export.base import ExportError
from litmt.deploy.export.hf import check_hf_exportable, export_hf

ROOT = Path(__file__).resolve().parents[4]
KINDS = {
    "pre-norm": dict(norm_first=True),  # Pegasus
    "post-norm": dict(norm_first=False),  # Marian
    "post-norm-unshared": dict(norm_first=False, share_embeddings=False),
    "post-norm-split-silu-untied": dict(
        norm_first=False, positional="sinusoidal_split", activation="silu", tie_output=False
    ),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def exported(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    ckpt = build_tiny_checkpoint(d, steps=40, **KINDS[request.param])
    return ckpt, export_hf(ckpt, d / "hf")


def test_logits_and_greedy_match(exported):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ckpt, out = exported
    loaded = load_model(ckpt)
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    en, _ = corpus()
    texts = en[:40]
    assert tok(texts)["input_ids"] == loaded.tokenizer.encode_src(texts)
    enc = tok(texts[:8], return_tensors="pt", padding=True)
    dec = torch.randint(4, loaded.model.config.tgt_vocab_size, (8, 7))
    dec[:, 0] = 2
    with torch.no_grad():
        theirs = hf(**enc, decoder_input_ids=dec).logits
        ours = loaded.model(enc["input_ids"], dec)
    assert (ours - theirs).abs().max().item() < 1e-4
    translator = Translator(loaded.model, loaded.tokenizer, device="cpu")
    ref = translator.translate(texts, method="greedy")
    budgets = [int(1.2 * len(ids) + 10) + 1 for ids in loaded.tokenizer.encode_src(texts)]
    assert hf_translate(out, texts, budgets) == ref  # pipeline("translation") or its steps
    assert "BLEU" not in (out / "README.md").read_text()  # no test set given


def test_export_import_round_trip(tmp_path):
    marian = make_marian_dir(tmp_path / "marian", layers=2, tie=False, init_std=0.3)
    ckpt = tmp_path / "imported.ckpt"
    import_hf(OmegaConf.create({"model_dir": str(marian), "out": str(ckpt)}))
    out = export_hf(ckpt, tmp_path / "hf")
    again = read_hf_dir(out)
    first = load_model(ckpt)
    assert again.config == first.model.config
    assert again.tokenizer.to_dict() == first.tokenizer.to_dict()  # byte-identical
    assert set(again.weights) == set(first.model.state_dict())
    for name, tensor in first.model.state_dict().items():
        torch.testing.assert_close(again.weights[name], tensor, rtol=0, atol=0)


def test_unmappable_models_are_refused(tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path, steps=1, positional="rope")
    with pytest.raises(ExportError, match=r"model\.positional=rope") as err:
        export_hf(ckpt, tmp_path / "hf")
    assert "\n" not in str(err.value)
    loaded = load_model(ckpt)
    for key, value, match in (
        ("activation", "swiglu", r"model\.activation=swiglu"),
        ("layer_norm_eps", 1e-6, "layer_norm_eps"),
    ):
        cfg = type(loaded.model.config)(**{**loaded.model.config.to_dict(), key: value})
        cfg.positional = "sinusoidal"
        with pytest.raises(ExportError, match=match):
            check_hf_exportable(cfg, loaded.tokenizer)


@pytest.mark.slow
def test_export_script_writes_a_model_card(tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path, steps=1)
    en, de = corpus()
    (tmp_path / "test.en").write_text("\n".join(en[:20]) + "\n")
    (tmp_path / "test.de").write_text("\n".join(de[:20]) + "\n")
    cmd = [
        sys.executable, str(ROOT / "scripts/export.py"), f"ckpt_path={ckpt}",
        f"out={tmp_path / 'hf'}", "format=hf", f"card.test_src={tmp_path / 'test.en'}",
        f"card.test_ref={tmp_path / 'test.de'}", "card.test_name=tiny-test",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "language: [en, de]" in card and "## Scores on tiny-test" in card
    assert "BLEU|nrefs:1|" in card and "chrF2|nrefs:1|" in card
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "already exists" in res.stderr


def test_force_replaces_an_hf_export_but_never_other_data(tmp_path):
    from litmt.errors import ConfigError

    ckpt = build_tiny_checkpoint(tmp_path, steps=1)
    out = export_hf(ckpt, tmp_path / "hf")
    with pytest.raises(ConfigError, match="already exists; pass force=true"):
        export_hf(ckpt, out)
    assert export_hf(ckpt, out, force=True) == out  # an export: replaced
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not a litmt export; force=true only replaces"):
        export_hf(ckpt, precious, force=True)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert not list(tmp_path.glob(".home.*")) and not list(tmp_path.glob(".hf.*"))  # no leftovers
