"""`litmt.models.Linear`: oneDNN inference GEMMs against `F.linear`, cache invalidation, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from litmt.errors import ConfigError
from litmt.models import Linear, Seq2SeqTransformer, TransformerConfig, onednn_available
from litmt.models import linear as linear_mod

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="no oneDNN in this build")


def _reference(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """float64 x @ W^T + b, an independent reference."""
    w = layer.weight.detach().double()
    b = layer.bias.detach().double() if layer.bias is not None else 0.0
    return (x.double() @ w.t() + b).float()


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (3, 5, 64), (2, 1, 64), (160, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_inference_matches_a_float64_reference(shape, bias):
    torch.manual_seed(0)
    layer = Linear(64, 96, bias=bias, gemm="onednn")  # forced: these calls are small
    x = torch.randn(*shape)
    with torch.no_grad():
        assert layer._use_onednn(x)
        out = layer(x)
    assert out.shape == (*shape[:-1], 96)
    torch.testing.assert_close(out, _reference(x, layer), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_non_contiguous_input_is_handled():
    layer = Linear(32, 16, gemm="onednn")
    x = torch.randn(8, 32, 4).transpose(1, 2)  # (8, 4, 32), not contiguous
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(out, _reference(x, layer), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_weight_follows_in_place_updates():
    """An optimizer step or load_state_dict changes the weight in place: the cache must notice."""
    torch.manual_seed(0)
    layer = Linear(16, 8, gemm="onednn")
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = layer(x)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(torch.randn(4, 16)).pow(2).sum().backward()
    opt.step()
    with torch.no_grad():
        after = layer(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, _reference(x, layer), rtol=1e-5, atol=1e-5)
    other = Linear(16, 8)
    layer.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _reference(x, other), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_training_drops_the_packed_copy():
    """No stale packed weights kept alive while training between validations."""
    layer = Linear(256, 1024)
    with torch.no_grad():
        layer(torch.randn(8, 256))
    assert id(layer.weight) in linear_mod._PACKED
    layer(torch.randn(8, 256, requires_grad=True)).sum().backward()
    assert id(layer.weight) not in linear_mod._PACKED


@needs_onednn
def test_a_freed_weight_drops_its_packed_copy():
    layer = Linear(16, 8, gemm="onednn")
    with torch.no_grad():
        layer(torch.randn(2, 16))
    key = id(layer.weight)
    assert key in linear_mod._PACKED
    del layer
    assert key not in linear_mod._PACKED


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_training_gradients_match_a_float64_reference(bias):
    """The autograd path: oneDNN forward and input gradient, torch weight gradient."""
    torch.manual_seed(0)
    layer = Linear(48, 80, bias=bias, gemm="onednn")
    x = torch.randn(3, 7, 48, requires_grad=True)
    assert layer._onednn_mode(x) == "autograd"
    upstream = torch.randn(3, 7, 80)
    (layer(x) * upstream).sum().backward()

    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_() if bias else None
    (F.linear(x64, w64, b64) * upstream.double()).sum().backward()
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w64.grad.float(), rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, b64.grad.float(), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_training_step_agrees_across_gemm_backends():
    """Loss and every parameter gradient of a full model: onednn vs torch GEMMs."""
    cfg = TransformerConfig(
        src_vocab_size=120, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2
    )
    src, tgt = torch.randint(4, 120, (3, 9)), torch.randint(4, 120, (3, 7))
    grads, losses = {}, {}
    for gemm in ("torch", "onednn"):
        torch.manual_seed(0)
        model = Seq2SeqTransformer(cfg).train()
        model.set_gemm(gemm)
        torch.manual_seed(1)  # the same dropout masks
        loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        losses[gemm] = loss.item()
        grads[gemm] = {n: p.grad for n, p in model.named_parameters()}
    assert losses["onednn"] == pytest.approx(losses["torch"], abs=1e-5)
    for name, g in grads["torch"].items():
        torch.testing.assert_close(grads["onednn"][name], g, rtol=1e-4, atol=1e-5, msg=name)


def test_autocast_and_small_calls_keep_f_linear():
    layer = Linear(16, 8)  # 16 x 8 per row: far below AUTO_MIN_MACS
    x = torch.randn(4, 16, requires_grad=True)
    assert layer._onednn_mode(x) is None
    big = Linear(256, 1024, gemm="auto")
    xb = torch.randn(8, 256)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert big._onednn_mode(xb) is None
        assert big(xb).dtype == torch.bfloat16  # autocast still applies


def test_torch_backend_and_other_dtypes_use_f_linear():
    layer = Linear(16, 8, gemm="torch")
    with torch.no_grad():
        assert not layer._use_onednn(torch.randn(2, 16))
        auto = Linear(16, 8).double()
        x = torch.randn(2, 16, dtype=torch.float64)
        assert not auto._use_onednn(x)
        torch.testing.assert_close(auto(x), F.linear(x, auto.weight, auto.bias))


def test_state_dict_keys_are_those_of_nn_linear():
    assert Linear(4, 3).state_dict().keys() == torch.nn.Linear(4, 3).state_dict().keys()
    assert isinstance(Linear(4, 3), torch.nn.Linear)


def test_unknown_gemm_backend_is_a_one_line_config_error():
    with pytest.raises(
        ConfigError, match="unknown gemm backend 'blas'; valid names: auto, onednn, torch"
    ):
        Linear(4, 3, gemm="blas")
    model = Seq2SeqTransformer(
        TransformerConfig(
            src_vocab_size=50,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_encoder_layers=1,
            n_decoder_layers=1,
        )
    )
    with pytest.raises(ConfigError, match="unknown gemm backend"):
        model.set_gemm("mkl")


def test_onednn_without_onednn_says_what_to_do(monkeypatch):
    monkeypatch.setattr(linear_mod, "onednn_available", lambda: False)
    with pytest.raises(ConfigError, match="gemm=onednn needs a PyTorch build with oneDNN"):
        Linear(4, 3, gemm="onednn")


@needs_onednn
def test_model_decoding_agrees_across_gemm_backends():
    """Full-model logits and a cached decode step: onednn vs torch GEMMs, fp32 rounding only."""
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=120, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2
    )
    model = Seq2SeqTransformer(cfg).eval()
    src = torch.randint(4, 120, (3, 9))
    tgt = torch.randint(4, 120, (3, 6))
    out = {}
    for gemm in ("torch", "onednn"):
        model.set_gemm(gemm)
        with torch.inference_mode():
            memory, mask = model.encode(src)
            state = model.init_state(memory, mask)
            step = model.decode_step(tgt[:, 0], state)
            out[gemm] = (model(src, tgt), step)
    torch.testing.assert_close(out["onednn"][0], out["torch"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["onednn"][1], out["torch"][1], rtol=1e-5, atol=1e-5)
