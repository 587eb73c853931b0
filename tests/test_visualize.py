"""Attention heatmaps: recorded weights, backend independence, PNG size, user errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_checkpoint import tiny_checkpoint_path

from litmt.checkpoint import load_model
from litmt.errors import ConfigError
from litmt.visualize import (
    attention_figure,
    collect_attention,
    cross_attention_figure,
    figure_to_array,
    plot_attention,
)

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
    assert figure_to_array(fig).shape == (120, 160, 3)
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
