"""Attention heatmaps: recorded weights, backend independence, PNG size, user errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_checkpoint import tiny_checkpoint_path

from litmt.checkpoint.load import load_model
from litmt.cli.visualize import restore_weight_kernels
from litmt.data.tokenization.tokenizer import BOS_ID
from litmt.decoding.analysis.attention_maps import (
    attention_figure,
    collect_attention,
    cross_attention_figure,
    plot_attention,
)
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer
from litmt.models.mha import recording_weights

SENTENCE = "A big dog sleeps outside."


@pytest.fixture(scope="session")
def loaded(tmp_path_factory):
    return load_model(tiny_checkpoint_path(tmp_path_factory))


@pytest.fixture(scope="session")
def maps(loaded):
    return collect_attention(loaded.model, loaded.tokenizer, SENTENCE)


def test_maps_have_the_expected_shapes_and_are_distributions(loaded, maps):
    cfg = loaded.model.config
    s = len(loaded.tokenizer.encode_src([SENTENCE])[0])
    t = len(maps.tgt_out_pieces)
    assert maps.tgt_in_pieces[0] == "<s>" and maps.tgt_out_pieces[-1] == "</s>"
    assert maps.tgt_in_pieces[1:] == maps.tgt_out_pieces[:-1]
    assert len(maps.src_pieces) == s
    expected = {"encoder": (s, s), "decoder": (t, t), "cross": (t, s)}
    for kind, (tq, tk) in expected.items():
        layers = cfg.n_encoder_layers if kind == "encoder" else cfg.n_decoder_layers
        assert len(maps.weights[kind]) == layers
        for w in maps.weights[kind]:
            assert w.shape == (cfg.n_heads, tq, tk)
            torch.testing.assert_close(w.sum(-1), torch.ones(cfg.n_heads, tq))
    for w in maps.weights["decoder"]:  # causal: nothing above the diagonal
        assert torch.all(w.triu(diagonal=1) == 0)
    assert maps.translation == "Ein großer Hund schläft draußen."


def test_weights_do_not_depend_on_the_backend_and_recording_is_switched_off(loaded, maps):
    model = loaded.model
    model.set_attention_backend("math")
    try:
        again = collect_attention(model, loaded.tokenizer, SENTENCE)
    finally:
        model.set_attention_backend("sdpa")
    for kind in maps.weights:
        for a, b in zip(maps.weights[kind], again.weights[kind], strict=True):
            torch.testing.assert_close(a, b)
    assert all(not m.record_weights and m.last_weights is None for m in model.attention_modules())


def test_forced_target(loaded):
    forced = collect_attention(loaded.model, loaded.tokenizer, SENTENCE, target="Ein Hund.")
    assert forced.translation == "Ein Hund."
    assert (
        forced.weights["cross"][0].shape[1]
        == len(loaded.tokenizer.encode_tgt(["Ein Hund."])[0]) + 1
    )


@pytest.mark.parametrize(
    ("grid", "layers", "heads"), [(False, None, None), (True, [0, -1], [1, 3])]
)
def test_png_has_the_requested_pixel_size(maps, tmp_path, grid, layers, heads):
    fig = plot_attention(
        maps, "cross", layers=layers, heads=heads, grid=grid, figsize=(6.4, 4.8), dpi=50
    )
    path = tmp_path / "attn.png"
    fig.savefig(path, dpi=50)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (320, 240)
    if grid:
        assert [ax.get_title() for ax in fig.axes] == [
            "layer 0 head 1",
            "layer 0 head 3",
            "layer 1 head 1",
            "layer 1 head 3",
        ]
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == maps.src_pieces
        assert [t.get_text() for t in ax.get_yticklabels()] == maps.tgt_out_pieces


def test_single_panel_is_the_mean_of_the_selected_heads(maps):
    fig = plot_attention(maps, "encoder", layers=[0], heads=[0, 2])
    shown = fig.axes[0].images[0].get_array()
    expected = maps.weights["encoder"][0][[0, 2]].mean(0).numpy()
    np.testing.assert_allclose(np.asarray(shown), expected, rtol=1e-6)
    assert fig.axes[0].get_title() == "layer 0, heads [0, 2] (mean)"


def test_attention_figure_and_rendering_for_loggers(loaded):
    fig = attention_figure(
        loaded.model, loaded.tokenizer, SENTENCE, "decoder", figsize=(4, 3), dpi=40
    )
    assert tuple(fig.get_size_inches() * fig.dpi) == (160, 120)
    cross = cross_attention_figure(loaded.model, loaded.tokenizer, SENTENCE, figsize=(4, 3))
    assert cross.axes[0].get_title() == "layer 1, all heads (mean)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(kind="self"), "unknown attention kind 'self'; valid kinds: cross, encoder, decoder"),
        (dict(layers=[2]), "layer 2 does not exist: the model has 2 layers (0-1)"),
        (dict(heads=[4]), "head 4 does not exist: the model has 4 heads (0-3)"),
        (dict(heads=[]), "no heads selected"),
    ],
)
def test_bad_selections_raise_clear_errors(maps, kwargs, message):
    kind = kwargs.pop("kind", "cross")
    with pytest.raises(ConfigError) as err:
        plot_attention(maps, kind, **kwargs)
    assert message in str(err.value)


def approximate_model(loaded, **attention) -> Seq2SeqTransformer:
    """The tiny checkpoint's weights, run with other self-attention kernels."""
    model = Seq2SeqTransformer(loaded.model.config)
    model.load_state_dict(loaded.model.state_dict())
    for site, (name, options) in attention.items():
        model.set_attention_backend(name, site, **options)
    return model.eval()


def maps_of(loaded):
    return collect_attention(loaded.model, loaded.tokenizer, SENTENCE, target="Ein großer Hund.")


def test_local_window_heatmap_is_zero_outside_the_window(loaded):
    window = 1
    model = approximate_model(
        loaded,
        encoder_self=("local", {"window": window}),
        decoder_self=("local", {"window": window}),
    )
    maps = collect_attention(model, loaded.tokenizer, SENTENCE, target="Ein großer Hund.")
    for kind in ("encoder", "decoder"):
        for w in maps.weights[kind]:  # (H, Tq, Tk)
            i = torch.arange(w.size(1))[:, None]
            j = torch.arange(w.size(2))[None, :]
            far = (j - i).abs() > window if kind == "encoder" else (j > i) | (j < i - window)
            assert w[:, far].abs().max() == 0, f"{kind}: weight outside the window"
            assert w[:, ~far].min() > 0  # inside the window: softmax over real keys
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    # the window is narrower than the sentence: softmax attention would look different
    assert not torch.allclose(maps.weights["encoder"][0], maps_of(loaded).weights["encoder"][0])


def test_linear_heatmap_rows_sum_to_one_and_are_what_the_model_computes(loaded):
    model = approximate_model(
        loaded, encoder_self=("linear", {}), decoder_self=("linear", {}), cross=("linear", {})
    )
    maps = collect_attention(model, loaded.tokenizer, SENTENCE, target="Ein großer Hund.")
    for kind in ("encoder", "decoder", "cross"):
        for w in maps.weights[kind]:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]), atol=1e-5, rtol=0)
            assert (w >= 0).all()
    for w in maps.weights["decoder"]:
        assert torch.all(w.triu(diagonal=1) == 0)
    # recording the weights changes nothing the model outputs: they are the ones it applies
    src = torch.tensor([loaded.tokenizer.encode_src([SENTENCE])[0]])
    tgt = torch.tensor([[BOS_ID, *loaded.tokenizer.encode_tgt(["Ein großer Hund."])[0]]])
    with torch.no_grad(), recording_weights(model.attention_modules()):
        recorded = model(src, tgt)
    assert all(not m.record_weights and m.last_weights is None for m in model.attention_modules())
    with torch.no_grad():
        plain = model(src, tgt)
    torch.testing.assert_close(plain, recorded, atol=1e-5, rtol=1e-5)


def test_heatmaps_of_a_checkpoint_use_its_own_approximate_kernels(loaded):
    trained = {
        **loaded.model.config.to_dict(),
        "attention": {
            "encoder_self": "sparse",
            "decoder_self": "local",
            "cross": "flash",  # fused: math stands in, so it builds without a GPU
            "encoder_self_options": {"block_size": 2},
            "decoder_self_options": {"window": 3},
            "cross_options": {},
        },
    }
    model = approximate_model(loaded)
    model.set_attention_backend("math")
    restore_weight_kernels(model, trained)
    kernels = {m.site: m.kernel for m in model.attention_modules()}
    assert kernels["encoder_self"].name == "sparse" and kernels["encoder_self"].block_size == 2
    assert kernels["decoder_self"].name == "local" and kernels["decoder_self"].window == 3
    assert kernels["cross"].name == "math"
