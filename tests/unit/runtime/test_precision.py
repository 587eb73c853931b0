"""Precision strings → compute dtypes, the `auto` default, FP8 helpers and the inference plan
(issue 16 items 2, 4, 5 and 9)."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from train_utils import compose_train, tiny_overrides, write_toy_corpus

from litmt.errors import ConfigError
from litmt.runtime.fp8 import drop_fp8_extra_state, fp8_disabled, hide_tied_linears
from litmt.runtime.precision import (
    InferencePlan,
    compute_dtype,
    configure_precision,
    inference_plan,
    resolve_precision,
)

ALL = {
    "32-true": torch.float32,
    "16-mixed": torch.float16,
    "bf16-mixed": torch.bfloat16,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "64-true": torch.float64,
    "transformer-engine": torch.bfloat16,
    "transformer-engine-float16": torch.float16,
    32: torch.float32,
    16: torch.float16,
    64: torch.float64,
    "32": torch.float32,
    "16": torch.float16,
    "bf16": torch.bfloat16,
    None: torch.float32,
}


# -- item 2: one mapping for every Lightning precision ---------------------------------------
@pytest.mark.parametrize(("precision", "dtype"), list(ALL.items()))
def test_compute_dtype_of_every_lightning_precision(precision, dtype) -> None:
    assert compute_dtype(precision) == dtype


def test_compute_dtype_of_a_te_plugin_reads_its_autocast_dtype() -> None:
    # Lightning's TE plugin reports precision="transformer-engine" (a class attribute) for both
    # variants; the float16 one is told apart by its dtype.
    plugin = SimpleNamespace(precision="transformer-engine", fallback_compute_dtype=torch.float16)
    assert compute_dtype(plugin) == torch.float16
    assert compute_dtype(SimpleNamespace(precision="bf16-mixed")) == torch.bfloat16


def test_unknown_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown precision 'fp7'"):
        compute_dtype("fp7")


@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_module_setup_validates_kernels_in_the_te_compute_dtype(precision: str) -> None:
    """A half-only kernel (flash, te) is validated against bf16/fp16 under FP8, not fp32
    (the old `split("-")[0]` mapping gave "transformer" → float32 and the kernels refused)."""
    from litmt.training.module import TranslationModule

    cfg = {"src_vocab_size": 32, "tgt_vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32,
           "n_encoder_layers": 1, "n_decoder_layers": 1}  # fmt: skip
    module = TranslationModule(cfg, tokenizer=None, src_lang="en", tgt_lang="de")
    seen = {}

    def validate(device, dtype=None, **kw):
        seen["dtype"] = dtype

    module.model.validate_backends = validate
    want = ALL[precision]
    plugin = SimpleNamespace(precision="transformer-engine", fallback_compute_dtype=want)
    module._trainer = SimpleNamespace(
        precision=plugin.precision,
        precision_plugin=plugin,
        strategy=SimpleNamespace(root_device=torch.device("cpu"), precision_plugin=plugin),
        datamodule=None,
    )
    module.setup("validate")
    assert seen["dtype"] == want


def test_flash_validation_passes_under_fp8_through_the_real_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """attention=flash on an (emulated) sm90 GPU under trainer.precision=transformer-engine:
    `Seq2SeqTransformer.validate_backends` gets bf16, which flash serves (it refused the
    float32 the old mapping gave, with "does not run in float32")."""
    from litmt.training.module import TranslationModule

    fake = types.ModuleType("flash_attn")  # construction imports it; no kernel runs here
    fake.flash_attn_func = fake.flash_attn_varlen_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    cfg = {"src_vocab_size": 32, "tgt_vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32,
           "n_encoder_layers": 1, "n_decoder_layers": 1,
           "attention": {"encoder_self": "flash", "decoder_self": "flash", "cross": "flash"}}  # fmt: skip
    module = TranslationModule(cfg, tokenizer=None, src_lang="en", tgt_lang="de")
    plugin = SimpleNamespace(precision="transformer-engine", fallback_compute_dtype=torch.bfloat16)
    module._trainer = SimpleNamespace(
        precision=plugin.precision,
        precision_plugin=plugin,
        strategy=SimpleNamespace(root_device=torch.device("cuda", 0), precision_plugin=plugin),
        datamodule=None,
    )
    module.setup("validate")  # raises BackendError if flash is asked for float32


# -- item 9: the auto default --------------------------------------------------------------
@pytest.mark.parametrize(
    ("accelerator", "cuda", "bf16", "want"),
    [
        ("auto", True, True, "bf16-mixed"),
        ("gpu", True, False, "16-mixed"),
        ("cuda", True, True, "bf16-mixed"),
        ("auto", False, False, "32-true"),
        ("cpu", True, True, "32-true"),
        ("mps", True, True, "32-true"),
    ],
)
def test_auto_precision_follows_the_device(accelerator, cuda, bf16, want) -> None:
    got = resolve_precision("auto", accelerator, cuda_available=cuda, bf16_supported=bf16)
    assert got == want


def test_explicit_precision_passes_through() -> None:
    assert resolve_precision("16-mixed", "gpu", cuda_available=True, bf16_supported=True) == (
        "16-mixed"
    )


def test_default_config_is_auto_and_resolves_to_fp32_on_this_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`python scripts/train.py` must not pin 32-true: the default trainer says auto, and on a
    machine without CUDA it resolves to 32-true, logged in one line."""
    cfg = compose_train([], tmp_path)
    assert cfg.trainer.precision == "auto"
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU default")
    with caplog.at_level(logging.INFO, logger="litmt.runtime.precision"):
        assert configure_precision(cfg.trainer.precision, cfg.trainer.accelerator) == "32-true"
    lines = [r.getMessage() for r in caplog.records if r.name == "litmt.runtime.precision"]
    assert len(lines) == 1 and lines[0].startswith("precision: 32-true (auto")


def test_auto_on_a_mocked_cuda_gpu_sets_tf32_and_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulated
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with caplog.at_level(logging.INFO, logger="litmt.runtime.precision"):
            assert configure_precision("auto", "auto") == "16-mixed"
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert "precision: 16-mixed (auto, on CUDA Tesla V100" in caplog.text


def test_build_trainer_resolves_auto_on_cpu(tmp_path: Path) -> None:
    from litmt.cli.train import build_trainer

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU default")
    cfg = compose_train(["trainer.accelerator=cpu"], tmp_path)
    trainer = build_trainer(cfg, [], [])
    assert trainer.precision == "32-true"


# -- item 4: FP8 keeps tying; FP8 checkpoints load -----------------------------------------
class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.proj = nn.Linear(16, 16)
        self.out = nn.Linear(16, 32, bias=False)
        self.out.weight = self.embed.weight


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch):
    """A stand-in `transformer_engine` with what Lightning's TE plugin touches: a Linear and a
    LayerNorm class (with `_extra_state` like TE's modules), `fp8_autocast`, DelayedScaling."""

    class Linear(nn.Linear):
        def __init__(self, i: int, o: int, bias: bool = True) -> None:
            super().__init__(i, o, bias=bias)

        def get_extra_state(self):
            return torch.zeros(1)

        def set_extra_state(self, state) -> None:
            pass

    Linear.__module__ = "transformer_engine.pytorch.module.linear"
    calls = []

    class _Ctx:
        def __init__(self, enabled: bool = True, fp8_recipe=None) -> None:
            calls.append(enabled)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    te = types.ModuleType("transformer_engine")
    te_pt = types.ModuleType("transformer_engine.pytorch")
    te_pt.Linear, te_pt.LayerNorm, te_pt.fp8_autocast = Linear, nn.LayerNorm, _Ctx
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.DelayedScaling = lambda **kw: SimpleNamespace(**kw)
    te.pytorch, te.common, common.recipe = te_pt, common, recipe
    for name, mod in {"transformer_engine": te, "transformer_engine.pytorch": te_pt,
                      "transformer_engine.common": common,
                      "transformer_engine.common.recipe": recipe}.items():  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    import lightning.fabric.plugins.precision.transformer_engine as fabric_te

    monkeypatch.setattr(fabric_te, "_TRANSFORMER_ENGINE_AVAILABLE", True)
    return SimpleNamespace(Linear=Linear, calls=calls)


def test_fp8_conversion_keeps_the_output_projection_tied(fake_te) -> None:
    from litmt.runtime.fp8 import fp8_precision_plugin

    model = _Tied()
    plugin = fp8_precision_plugin("transformer-engine")
    model = plugin.convert_module(model)
    assert isinstance(model.proj, fake_te.Linear)  # untied layers are converted
    assert not isinstance(model.out, fake_te.Linear)
    assert model.out.weight is model.embed.weight  # still one parameter
    assert model.embed.weight.dtype == torch.float32  # master weights (see below)


@pytest.mark.parametrize(
    ("name", "compute"),
    [("transformer-engine", torch.bfloat16), ("transformer-engine-float16", torch.float16)],
)
def test_fp8_training_keeps_float32_master_weights(fake_te, name, compute) -> None:
    """Lightning's plugin casts the module to `weights_dtype` (bf16 / fp16), so the optimizer
    updates half-precision weights and an update below their spacing is lost; litmt's plugin
    keeps float32 weights and computes in bf16 / fp16 (`fallback_compute_dtype`)."""
    from litmt.runtime.fp8 import fp8_precision_plugin
    from litmt.runtime.precision import precision_name

    plugin = fp8_precision_plugin(name)
    assert plugin.weights_dtype == torch.float32
    assert compute_dtype(plugin) == plugin.fallback_compute_dtype == compute
    assert precision_name(plugin) == name  # recorded in checkpoints as before
    model = plugin.convert_module(_Tied())
    assert isinstance(model.proj, fake_te.Linear)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # a small update survives: 1 - 1e-4 is 1.0 in bf16 (spacing 2^-8) and in fp16 (2^-11)
    weight = model.proj.weight
    with torch.no_grad():
        weight.fill_(1.0)
    weight.grad = torch.ones_like(weight)
    torch.optim.SGD([weight], lr=1e-4).step()
    assert torch.all(weight < 1.0)


def test_fp8_refuses_a_linear_lightning_converts_but_te_cannot_run(fake_te) -> None:
    """in_features 24: Lightning's rule (in % 8, out % 16) converts it; TE's FP8 GEMM needs
    the last input dimension % 16 and would assert on the first batch."""
    from litmt.runtime.fp8 import fp8_precision_plugin

    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 32))
    with pytest.raises(ConfigError, match=r"^FP8: layer 2 has in_features=24, which Transformer"):
        fp8_precision_plugin("transformer-engine").convert_module(model)


def test_lightning_plain_conversion_unties_the_projection(fake_te) -> None:
    """The defect itself: Lightning's own plugin clones the tied weight into a te.Linear."""
    from lightning.pytorch.plugins.precision.transformer_engine import (
        TransformerEnginePrecision,
    )

    model = TransformerEnginePrecision(weights_dtype=torch.bfloat16).convert_module(_Tied())
    assert isinstance(model.out, fake_te.Linear)
    assert model.out.weight is not model.embed.weight


def test_build_trainer_uses_the_tied_fp8_plugin(
    fake_te, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trainer.precision=transformer-engine(-float16) builds litmt's plugin (tied weights stay
    tied, float32 master weights) computing in the string's dtype, not Lightning's plain
    plugin."""
    import litmt.cli.train as train_mod

    monkeypatch.setattr(train_mod, "check_precision", lambda precision: None)  # TE is faked
    for name, dtype in (("transformer-engine", torch.bfloat16),
                        ("transformer-engine-float16", torch.float16)):  # fmt: skip
        cfg = compose_train(["trainer=cpu", f"trainer.precision={name}"], tmp_path)
        plugin = train_mod.build_trainer(cfg, [], []).precision_plugin
        assert type(plugin).__name__ == "TiedTransformerEnginePrecision"
        assert plugin.weights_dtype == torch.float32
        assert compute_dtype(plugin) == dtype


def test_hide_tied_linears_restores_the_layers() -> None:
    model = _Tied()
    out = model.out
    with hide_tied_linears(model) as hidden:
        assert hidden == ["out"] and isinstance(model.out, nn.Identity)
    assert model.out is out and model.out.weight is model.embed.weight


def test_fp8_state_dict_loads_into_a_plain_model(fake_te) -> None:
    from litmt.runtime.fp8 import fp8_precision_plugin

    converted = fp8_precision_plugin("transformer-engine").convert_module(_Tied())
    state = converted.state_dict()
    assert "proj._extra_state" in state
    plain = _Tied()
    with pytest.raises(RuntimeError, match="_extra_state"):
        plain.load_state_dict(state)
    plain.load_state_dict(drop_fp8_extra_state(state))  # strict
    assert torch.equal(plain.proj.weight, converted.proj.weight.float())


def test_fp8_disabled_turns_fp8_off_only_when_te_is_loaded(fake_te) -> None:
    with fp8_disabled():
        pass
    assert fake_te.calls == [False]


# -- item 5: inference precision of a checkpoint ---------------------------------------------
CUDA = torch.device("cuda")


def _half_only(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def test_fp32_capable_kernels_run_unchanged() -> None:
    assert inference_plan(CUDA, lambda d: True, "bf16-mixed") == InferencePlan()


@pytest.mark.parametrize(
    ("trained", "bf16", "want"),
    [
        ("bf16-mixed", True, torch.bfloat16),
        ("16-mixed", True, torch.float16),
        ("transformer-engine", True, torch.bfloat16),
        (None, True, torch.bfloat16),
        (None, False, torch.float16),
        ("32-true", False, torch.float16),
    ],
)
def test_half_only_kernels_on_cuda_autocast_to_the_training_dtype(trained, bf16, want) -> None:
    plan = inference_plan(CUDA, _half_only, trained, bf16_supported=bf16)
    assert plan.autocast == want and plan.attention is None
    assert plan.message.startswith(f"inference in {str(want)[6:]} autocast on cuda")


def test_kernels_that_serve_no_dtype_here_switch_to_sdpa() -> None:
    plan = inference_plan(torch.device("cpu"), lambda d: False, "bf16-mixed")
    assert plan == InferencePlan(
        attention="sdpa",
        message="inference with attention=sdpa in float32 on cpu (the checkpoint's attention "
        "kernels cannot run here)",
    )


# -- items 4 and 5 through the real loaders --------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from tiny_checkpoint import corpus

    from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig

    en, de = corpus()
    return Tokenizer.train(en, de, TokenizerConfig(vocab_size=80))


def _save(path: Path, tokenizer, extra_state: bool = False, **attention: str) -> Path:
    from litmt.checkpoint.io import save_model_checkpoint
    from litmt.models import Seq2SeqTransformer, TransformerConfig

    config = TransformerConfig(
        src_vocab_size=tokenizer.src_vocab_size, d_model=32, n_heads=4, d_ff=64,
        n_encoder_layers=1, n_decoder_layers=1, max_positions=32,
        **({"attention": attention} if attention else {}),
    )  # fmt: skip
    save_model_checkpoint(path, Seq2SeqTransformer(config), tokenizer, "en", "de")
    if extra_state:  # what a TE-converted model adds next to each te.Linear's weight
        ckpt = torch.load(path, weights_only=True)
        names = [k for k in ckpt["state_dict"] if k.endswith("proj.weight")]
        assert names
        for k in names:
            ckpt["state_dict"][k.replace(".weight", "._extra_state")] = torch.zeros(4)
        torch.save(ckpt, path)
    return path


def test_fp8_checkpoint_with_extra_state_loads_for_decoding_and_averaging(
    tmp_path: Path, tokenizer
) -> None:
    from litmt.checkpoint.load import load_model

    path = _save(tmp_path / "fp8.ckpt", tokenizer, extra_state=True)
    loaded = load_model(path, "cpu")  # strict load_state_dict: no unexpected keys
    assert not any(k.endswith("_extra_state") for k in loaded.model.state_dict())
    other = _save(tmp_path / "fp8b.ckpt", tokenizer, extra_state=True)
    load_model([path, other], "cpu")  # averaging reads the same weights


def test_checkpoint_of_a_kernel_that_cannot_run_here_translates_with_sdpa_and_one_line(
    tmp_path: Path, tokenizer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `flash` checkpoint where flash cannot serve float32 (here: the CPU, with flash-attn
    installed as far as the kernel knows): decoding switches to sdpa with one log line
    instead of raising."""
    from litmt.decoding.translator import Translator

    if torch.cuda.is_available():
        pytest.skip(
            "checks the CPU path; the GPU path is tests/integration/gpu/test_gpu_precision.py"
        )
    fake = types.ModuleType("flash_attn")  # installed, as far as the kernel can tell
    fake.flash_attn_func = fake.flash_attn_varlen_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    path = _save(tmp_path / "flash.ckpt", tokenizer, encoder_self="flash", cross="flash")
    with caplog.at_level(logging.INFO, logger="litmt.decoding.translator"):
        translator = Translator.from_checkpoint(path, device="cpu")
    assert translator.model.config.attention.encoder_self == "sdpa"
    assert translator.autocast is None
    assert len(translator.translate(["A red dog runs."], beam_size=2)) == 1
    lines = [r.getMessage() for r in caplog.records if "inference with" in r.getMessage()]
    assert lines == [
        "inference with attention=sdpa in float32 on cpu (the checkpoint's attention kernels "
        "cannot run here)"
    ]


def test_checkpoint_records_the_training_precision() -> None:
    from litmt.checkpoint.io import META_KEY
    from litmt.runtime.precision import precision_name
    from litmt.training.module import TranslationModule

    cfg = {"src_vocab_size": 32, "tgt_vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32,
           "n_encoder_layers": 1, "n_decoder_layers": 1}  # fmt: skip
    tok = SimpleNamespace(to_dict=lambda: {})
    module = TranslationModule(cfg, tokenizer=tok, src_lang="en", tgt_lang="de")
    plugin = SimpleNamespace(precision="transformer-engine", fallback_compute_dtype=torch.float16)
    module._trainer = SimpleNamespace(precision_plugin=plugin, precision=plugin.precision)
    ckpt: dict = {}
    module.on_save_checkpoint(ckpt)
    assert ckpt[META_KEY]["precision"] == "transformer-engine-float16"
    assert precision_name(SimpleNamespace(precision="bf16-mixed")) == "bf16-mixed"


def test_a_training_run_resolves_the_precision_once(tmp_path: Path, monkeypatch) -> None:
    """One `resolve_precision` per run: the data padding and the trainer share its result."""
    import litmt.runtime.precision as precision_mod
    from litmt.cli.train import train

    calls: list[object] = []
    real = precision_mod.resolve_precision

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(precision_mod, "resolve_precision", counted)
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 40, "valid": 4, "test": 4})
    overrides = [*tiny_overrides(corpus, tmp_path), "trainer.max_steps=1", "callbacks=none"]
    overrides += ["trainer.limit_val_batches=0", "test_after_training=false"]
    train(compose_train(overrides, tmp_path))
    assert len(calls) == 1, calls
