"""GPU checks of issue 16 items 2-5 (marked `gpu`; skipped without CUDA or the package):
FP8 with attention=te and flash (padded batches, tied output, decoding), reloading the FP8
checkpoint, and a GPU `Translator` on a flash checkpoint. No `datasets` needed: the data is a
toy corpus tokenised straight into `TokenizedPairs`."""

from __future__ import annotations

import functools
import importlib.util
import random
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from litmt.checkpoint.io import META_KEY, load_checkpoint, save_model_checkpoint
from litmt.data.batching.collate import TokenizedPairs, collate
from litmt.data.batching.sampler import TokenBudgetBatchSampler
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.decoding.search.greedy import greedy_search
from litmt.decoding.translator import Translator
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.runtime.fp8 import fp8_disabled, fp8_precision_plugin, pad_multiple_for
from litmt.training.module import TranslationModule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
needs_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="needs transformer_engine"
)
needs_flash = pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="needs flash_attn"
)
WORDS = {"a": "ein", "dog": "hund", "red": "rot", "runs": "rennt", "man": "mann", "big": "groß"}


@pytest.fixture(scope="module")
def toy() -> tuple[Tokenizer, TokenizedPairs]:
    rng = random.Random(0)
    src, tgt = [], []
    for _ in range(300):
        ws = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 9))]
        src.append(" ".join(ws))
        tgt.append(" ".join(WORDS[w] for w in ws))
    tok = Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=64))
    return tok, TokenizedPairs.from_lists(tok.encode_src(src), tok.encode_tgt(tgt))


def _config(tok: Tokenizer, backend: str) -> dict:
    # every Linear of this size meets TE's FP8 rule (in % 16, out % 16); vocab 64 too
    return {"src_vocab_size": tok.src_vocab_size, "d_model": 64, "n_heads": 4, "d_ff": 128,
            "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.0,
            "attention": {"encoder_self": backend, "decoder_self": backend, "cross": backend}}  # fmt: skip


def _fit_fp8(tmp_path: Path, toy, backend: str) -> tuple[TranslationModule, Path]:
    tok, pairs = toy
    multiple = pad_multiple_for("transformer-engine")
    sampler = TokenBudgetBatchSampler(pairs.src_lengths(), pairs.tgt_lengths(), max_tokens=200,
                                      seed=0, rank=0, world_size=1)  # fmt: skip
    loader = DataLoader(pairs, batch_sampler=sampler,
                        collate_fn=functools.partial(collate, pad_to_multiple=multiple))  # fmt: skip
    module = TranslationModule(_config(tok, backend), tok, "en", "de")
    trainer = L.Trainer(
        accelerator="gpu", devices=1, plugins=[fp8_precision_plugin("transformer-engine")],
        max_steps=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=loader)
    ckpt = tmp_path / f"fp8-{backend}.ckpt"
    trainer.save_checkpoint(ckpt)
    return module, ckpt


@needs_te
@pytest.mark.parametrize(
    "backend", ["te", "sdpa", pytest.param("flash", marks=needs_flash)]
)  # item 2: half-only kernels pass setup under FP8
def test_fp8_trains_keeps_tying_and_its_checkpoint_reloads_and_translates(
    tmp_path: Path, toy, backend: str
) -> None:
    module, ckpt = _fit_fp8(tmp_path, toy, backend)
    model = module.model
    assert model.output_proj.weight is model.tgt_embed.weight  # item 4: still tied
    state = load_checkpoint(ckpt)["state_dict"]
    assert any(k.endswith("._extra_state") for k in state)  # TE layers were in the model
    translator = Translator.from_checkpoint(ckpt, device="cuda")  # item 4: strict load works
    out = translator.translate(["a red dog runs", "a man"], beam_size=2)
    assert len(out) == 2


@needs_te
def test_decoding_inside_fp8_autocast_is_safe_with_odd_row_counts(toy) -> None:
    """Item 3: a decode step has B x 1 rows (here B = 3); `fp8_disabled` runs it without FP8."""
    tok, _ = toy
    plugin = fp8_precision_plugin("transformer-engine")
    model = plugin.convert_module(
        Seq2SeqTransformer(TransformerConfig.from_dict(_config(tok, "sdpa")))
    ).cuda()
    ids = tok.encode_src(["a red dog"])[0]
    src = torch.tensor([ids] * 3)  # (B, S) with B = 3: B x 1 decode rows
    with plugin.forward_context(), fp8_disabled():
        hyps = greedy_search(model.eval(), src.cuda(), max_len_a=0, max_len_b=5)
    assert len(hyps) == 3


@needs_flash
def test_gpu_translator_runs_a_flash_checkpoint_in_its_training_precision(
    tmp_path: Path, toy
) -> None:
    """Item 5: fp32 into flash would crash; the checkpoint's bf16 autocast is used instead."""
    tok, _ = toy
    model = Seq2SeqTransformer(TransformerConfig.from_dict(_config(tok, "flash")))
    path = save_model_checkpoint(tmp_path / "flash.ckpt", model, tok, "en", "de")
    ckpt = torch.load(path, weights_only=False)
    ckpt[META_KEY]["precision"] = "bf16-mixed"
    torch.save(ckpt, path)
    translator = Translator.from_checkpoint(path, device="cuda")
    assert translator.autocast == torch.bfloat16
    assert translator.model.config.attention.encoder_self == "flash"
    assert len(translator.translate(["a red dog runs"], beam_size=3)) == 1
