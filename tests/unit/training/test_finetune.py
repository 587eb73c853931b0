"""Fine-tuning (`init_from`): a tiny model adapts to a shifted task with the tokenizer of its
checkpoint, a fresh step count and the checkpoint's architecture; shape mismatches are
one-line errors; frozen parameters keep their values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_checkpoint import corpus, tiny_checkpoint_path
from train_utils import REPO, compose_train, script_env, tiny_overrides

from litmt.checkpoint.io import load_checkpoint
from litmt.checkpoint.load import load_model
from litmt.cli.train import train
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.errors import CheckpointError, ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.training.finetune import freeze, load_weights, read_init_checkpoint

STEPS = 40


def shifted(german: str) -> str:
    """The shifted task: the German words in reverse order ("Hund roter Ein ." style)."""
    return " ".join(reversed(german.rstrip(".").split())) + " ."


@pytest.fixture(scope="module")
def init_ckpt(tmp_path_factory) -> Path:
    """The tiny checkpoint, saved as if 500 steps into a run (which must not carry over)."""
    raw = torch.load(tiny_checkpoint_path(tmp_path_factory), weights_only=True)
    out = tmp_path_factory.mktemp("init") / "init.ckpt"
    torch.save({**raw, "global_step": 500, "epoch": 7}, out)
    return out


@pytest.fixture(scope="module")
def shifted_corpus(tmp_path_factory) -> Path:
    en, de = corpus(seed=3)
    root = tmp_path_factory.mktemp("shifted")
    for split, rows in (("train", slice(0, 400)), ("valid", slice(400, 460)), ("test", slice(460, 500))):  # fmt: skip
        (root / f"{split}.en").write_text("\n".join(en[rows]) + "\n", encoding="utf-8")
        (root / f"{split}.de").write_text("\n".join(map(shifted, de[rows])) + "\n", "utf-8")
    return root


def finetune_overrides(corpus_dir: Path, out: Path, init: Path, *extra: str) -> list[str]:
    return [
        *tiny_overrides(corpus_dir, out),
        f"init_from={init}",
        f"trainer.max_steps={STEPS}",
        "trainer.max_epochs=-1",
        "trainer.val_check_interval=20",
        "trainer.check_val_every_n_epoch=null",
        "module.optimizer.lr=3e-3",
        "module.scheduler.warmup_steps=10",
        "callbacks.bleu=null",
        "callbacks.heatmap=null",
        "callbacks.early_stopping=null",
        "callbacks.model_checkpoint.monitor=valid/loss",
        "callbacks.model_checkpoint.mode=min",
        "callbacks.model_checkpoint.filename='ft-{step}'",
        "test_after_training=false",
        *extra,
    ]


def _padded(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def mean_nll(ckpt: str | Path, split_dir: Path) -> float:
    """Per-token NLL of the checkpoint's model on `split_dir`'s valid split (plain torch)."""
    loaded = load_model(ckpt, "cpu")
    tok, model = loaded.tokenizer, loaded.model
    src_text = (split_dir / "valid.en").read_text(encoding="utf-8").splitlines()
    tgt_text = (split_dir / "valid.de").read_text(encoding="utf-8").splitlines()
    src = _padded(tok.encode_src(src_text))
    ys = tok.encode_tgt(tgt_text)
    tgt_in, tgt_out = _padded([[BOS_ID, *y] for y in ys]), _padded([[*y, EOS_ID] for y in ys])
    with torch.no_grad():
        logits = model(src, tgt_in)  # (B, T, V)
    return float(F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD_ID))


def test_finetuning_lowers_the_shifted_task_loss_and_keeps_the_tokenizer(
    init_ckpt, shifted_corpus, tmp_path
):
    cfg = compose_train(finetune_overrides(shifted_corpus, tmp_path, init_ckpt), tmp_path)
    metrics = train(cfg)
    last = metrics["last_checkpoint"]
    before, after = mean_nll(init_ckpt, shifted_corpus), mean_nll(last, shifted_corpus)
    assert after < 0.5 * before, f"shifted-task loss {before:.3f} -> {after:.3f}"
    init, tuned = load_checkpoint(init_ckpt), load_checkpoint(last)
    # the checkpoint's tokenizer, byte for byte; no tokenizer was trained on the new corpus
    assert tuned["litmt"]["tokenizer"] == init["litmt"]["tokenizer"]
    (tok_dir,) = (tmp_path / "data" / "tokenizers").iterdir()
    assert "-given-" in tok_dir.name
    assert (tok_dir / "src.model").read_bytes() == init["litmt"]["tokenizer"]["src_model"]
    # a fresh step count (not 500 + STEPS) and a fresh schedule (warmup from step 0)
    assert tuned["global_step"] == STEPS
    (sched,) = tuned["lr_schedulers"]
    assert sched["last_epoch"] == STEPS
    # the checkpoint's architecture (max_positions 48, not model=tiny's 256), `model`'s dropout
    config = tuned["litmt"]["model_config"]
    assert config["max_positions"] == init["litmt"]["model_config"]["max_positions"] == 48
    assert config["dropout"] == cfg.model.dropout == 0.1


def test_frozen_parameters_keep_their_values(init_ckpt, shifted_corpus, tmp_path):
    overrides = finetune_overrides(
        shifted_corpus, tmp_path, init_ckpt, "finetune.freeze=[embeddings,encoder]"
    )
    overrides[overrides.index(f"trainer.max_steps={STEPS}")] = "trainer.max_steps=20"
    metrics = train(compose_train(overrides, tmp_path))
    before = load_checkpoint(init_ckpt)["state_dict"]
    after = load_checkpoint(metrics["last_checkpoint"])["state_dict"]
    frozen = (
        "model.src_embed.",
        "model.tgt_embed.",
        "model.encoder_layers.",
        "model.encoder_norm.",
    )
    assert any(k.startswith("model.encoder_layers.") for k in before)
    for k, v in before.items():
        if k.startswith(frozen) or k == "model.output_proj.weight":  # tied to the embeddings
            assert torch.equal(after[k], v), f"{k} changed although frozen"
        elif k.startswith("model.decoder_layers.") and k.endswith(".weight"):
            assert not torch.equal(after[k], v), f"{k} did not train"


def _model_like(init, **changes) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(TransformerConfig.from_dict({**init.model_config, **changes}))


def _first_shape_difference(model: Seq2SeqTransformer, weights: dict) -> tuple[str, tuple, tuple]:
    for name, t in model.state_dict().items():
        if name in weights and weights[name].shape != t.shape:
            return name, tuple(weights[name].shape), tuple(t.shape)
    raise AssertionError("no shape differs")


def test_shape_mismatch_is_a_one_line_error_naming_the_parameter(init_ckpt):
    init = read_init_checkpoint(init_ckpt)
    model = _model_like(init, d_ff=96)
    name, theirs, ours = _first_shape_difference(model, init.weights)
    with pytest.raises(CheckpointError) as err:
        load_weights(model, init)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"parameter {name} has shape {theirs} in the checkpoint but {ours} in this model" in msg
    assert name.startswith("encoder_layers.0.") and theirs != ours
    with pytest.raises(CheckpointError, match=r"has no parameter encoder_layers\.2\."):
        load_weights(_model_like(init, n_encoder_layers=3), init)
    with pytest.raises(CheckpointError, match=r"parameter decoder_layers\.1\.\S+ that this"):
        load_weights(_model_like(init, n_decoder_layers=1), init)
    same = _model_like(init)
    load_weights(same, init)  # the same architecture loads every weight
    for k, v in same.state_dict().items():
        assert torch.equal(v, init.weights[k]), k


@pytest.mark.slow
def test_shape_mismatch_from_the_command_line(init_ckpt, shifted_corpus, tmp_path):
    # finetune.model_config=config builds `model`, which must fit the weights
    cmd = [sys.executable, "scripts/train.py", *tiny_overrides(shifted_corpus, tmp_path)]
    cmd += [f"init_from={init_ckpt}", "finetune.model_config=config", "model.d_ff=96"]
    cmd += ["callbacks=none"]
    proc = subprocess.run(
        cmd, cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: init_from={init_ckpt}: parameter encoder_layers.0.")
    assert "(128, 64) in the checkpoint but (96, 64) in this model" in last


def test_freeze_groups(init_ckpt):
    model = _model_like(read_init_checkpoint(init_ckpt))
    names = freeze(model, ["encoder"])
    assert names and all(n.startswith(("encoder_layers.", "encoder_norm.")) for n in names)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not trainable & set(names)
    assert "src_embed.weight" in trainable  # tied embeddings/output layer: not the encoder's
    with pytest.raises(ConfigError, match="unknown group 'encoders'"):
        freeze(model, ["encoders"])
    with pytest.raises(ConfigError, match="leaves no parameter to train"):
        freeze(_model_like(read_init_checkpoint(init_ckpt)), ["embeddings", "encoder", "decoder"])


def test_freezing_the_decoder_freezes_an_untied_output_projection():
    """An untied `output_proj` is the decoder's (a tied one is the embeddings'): freezing
    the decoder stops its gradient, and an optimizer step leaves it as it was."""
    from tiny_model import tiny_config

    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(tie_output=False))
    assert model.output_proj.weight is not model.tgt_embed.weight
    names = freeze(model, ["decoder"])
    assert "output_proj.weight" in names and not model.output_proj.weight.requires_grad
    assert model.src_embed.weight.requires_grad and model.tgt_embed.weight.requires_grad
    proj, embed = (t.detach().clone() for t in (model.output_proj.weight, model.tgt_embed.weight))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    src, tgt = torch.randint(4, 60, (3, 7)), torch.randint(4, 60, (3, 6))
    model(src, tgt[:, :-1]).logsumexp(-1).mean().backward()
    opt.step()
    assert model.output_proj.weight.grad is None
    assert torch.equal(model.output_proj.weight, proj)
    assert not torch.equal(model.tgt_embed.weight, embed)  # the embeddings do train
    # tied: the same tensor is the embeddings', so freezing the decoder leaves it trainable
    tied = Seq2SeqTransformer(tiny_config())
    assert "output_proj.weight" not in freeze(tied, ["decoder"])
    assert tied.output_proj.weight.requires_grad


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.dropout=0.3", "attention=math", "seed=1"],  # run-time keys only
        ["+model.attention.encoder_self_options.window=4"],
        ["model=base"],
        ["model.d_ff=96"],
        ["++model.n_heads=2"],
        ["experiment=multi30k_cpu"],  # `model` keys from an experiment file
    ],
)
def test_the_model_config_depends_on_the_composed_config_only(overrides, init_ckpt, tmp_path):
    """The default (`checkpoint`) keeps the checkpoint's architecture wherever a `model` key
    was set, in a Hydra run or not; only `finetune.model_config=config` builds `model`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from litmt.training.finetune import model_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    init = read_init_checkpoint(init_ckpt)
    requested = {**init.model_config, "d_ff": 96, "dropout": 0.3}
    for in_hydra_run in (True, False):
        if in_hydra_run:
            HydraConfig.instance().set_config(cfg)
        try:
            built = model_config(init, requested, cfg.finetune.model_config)
            assert built["d_ff"] == init.model_config["d_ff"]  # the checkpoint's shape
            assert built["dropout"] == 0.3  # from `model` either way
            assert model_config(init, requested, "config")["d_ff"] == 96
        finally:
            HydraConfig.instance().cfg = None  # as outside a Hydra run


def test_the_removed_auto_mode_names_the_new_spelling(init_ckpt):
    from litmt.training.finetune import model_config

    init = read_init_checkpoint(init_ckpt)
    with pytest.raises(ConfigError, match=r"^finetune\.model_config=auto was removed: .* pass "
                       r"finetune\.model_config=config to build `model` instead$"):  # fmt: skip
        model_config(init, dict(init.model_config), "auto")
