"""Fine-tuning a transformers Marian model: ``init_from=DIR`` (a ``save_pretrained``
directory) trains it with litmt; the loss falls and the tokenizer (source.spm, target.spm,
vocab.json ids) is kept byte for byte. The slow test does it on Multi30k."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("transformers")

from test_finetune import finetune_overrides, mean_nll
from train_utils import compose_train, run_train_script, write_toy_corpus

from benchmarks.hf_models import make_marian_dir
from litmt.checkpoint.hf_import import read_hf_dir
from litmt.checkpoint.io import load_checkpoint
from litmt.cli.import_hf import import_hf
from litmt.cli.train import train

MULTI30K = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "multi30k"


def _lines(path: Path, n: int | None = None) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:n]


def _check_tokenizer(last: str | Path, marian: Path) -> None:
    tok = load_checkpoint(last)["litmt"]["tokenizer"]
    assert tok == read_hf_dir(marian).tokenizer.to_dict()
    assert tok["src_model"] == (marian / "source.spm").read_bytes()
    assert tok["tgt_model"] == (marian / "target.spm").read_bytes()


def test_init_from_a_marian_directory(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    en, de = _lines(corpus / "train.en"), _lines(corpus / "train.de")
    marian = make_marian_dir(tmp_path / "marian", layers=1, en_de=(en, de), spm_size=40)
    init = tmp_path / "init.ckpt"
    import_hf(OmegaConf.create({"model_dir": str(marian), "out": str(init)}))
    cfg = compose_train(finetune_overrides(corpus, tmp_path, marian), tmp_path)
    last = train(cfg)["last_checkpoint"]
    before, after = mean_nll(init, corpus), mean_nll(last, corpus)
    assert after < before - 1.0, f"loss {before:.3f} -> {after:.3f}"
    _check_tokenizer(last, marian)


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_finetune_marian_on_multi30k(tmp_path):
    """A transformers-created Marian (d=128, 3+3, swish, sentencepiece trained on Multi30k)
    fine-tuned by scripts/train.py for 150 steps: valid loss falls, tokenizer unchanged."""
    en, de = _lines(MULTI30K / "train.en", 5000), _lines(MULTI30K / "train.de", 5000)
    marian = make_marian_dir(
        tmp_path / "marian", d_model=128, layers=3, heads=4, ffn=512, en_de=(en, de),
        spm_size=2000, init_std=0.02, eos_bias=0.0, max_positions=256,
    )  # fmt: skip
    init = tmp_path / "init.ckpt"
    import_hf(OmegaConf.create({"model_dir": str(marian), "out": str(init)}))
    out = tmp_path / "run"
    res = run_train_script(
        [
            "experiment=multi30k_cpu",
            f"data.dir={MULTI30K}",
            f"init_from={marian}",
            "trainer.max_steps=150",
            "trainer.max_time=null",
            "trainer.val_check_interval=150",
            "trainer.check_val_every_n_epoch=null",
            "trainer.max_epochs=-1",
            "module.scheduler.horizon=steps",
            "module.scheduler.warmup_steps=20",
            "callbacks.bleu=null",
            "callbacks.model_checkpoint.monitor=valid/loss",
            "callbacks.model_checkpoint.mode=min",
            "callbacks.heatmap=null",
            "callbacks.early_stopping=null",
            "test_after_training=false",
            "finalize.average_best=0",
            "finalize.beam_sizes=[]",
            "finalize.length_penalties=[]",
            "logger=csv",
            f"data.cache_dir={tmp_path / 'data'}",
            f"hydra.run.dir={out}",
        ],
        timeout=1500,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    last = out / "checkpoints" / "last.ckpt"
    valid = tmp_path / "valid"
    valid.mkdir()
    for lang in ("en", "de"):
        text = "\n".join(_lines(MULTI30K / f"valid.{lang}", 300)) + "\n"
        (valid / f"valid.{lang}").write_text(text, encoding="utf-8")
    before, after = mean_nll(init, valid), mean_nll(last, valid)
    print(f"multi30k fine-tune: valid loss {before:.3f} -> {after:.3f}")
    assert after < before - 1.0, f"valid loss {before:.3f} -> {after:.3f}"
    _check_tokenizer(last, marian)
