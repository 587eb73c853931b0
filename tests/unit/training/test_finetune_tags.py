"""Fine-tuning into many languages: ``init_from`` with ``data.directions`` needs the
checkpoint's tokenizer to hold every ``<2xx>`` tag as one piece. A one-pair or imported
checkpoint's does not; the run is refused at setup with one line naming the missing tags
(before, the tags were split into pieces and training failed later with a KeyError or an
AssertionError)."""

from __future__ import annotations

import pytest
from test_finetune import finetune_overrides
from tiny_checkpoint import build_tiny_multilingual_checkpoint, tiny_checkpoint_path
from tiny_corpora import write_multi
from train_utils import compose_train

from litmt.cli.train import train
from litmt.data.directions import parse_directions
from litmt.errors import ConfigError
from litmt.training.finetune import check_language_tags, read_init_checkpoint

PLACEMENTS = ("source", "target")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_one_pair_checkpoint_is_refused_before_training(placement, tmp_path_factory, tmp_path):
    init = tiny_checkpoint_path(tmp_path_factory)  # en-de, no <2xx> pieces
    corpus = write_multi(tmp_path / "corpus", {"train": 120, "valid": 12, "test": 12})
    overrides = finetune_overrides(
        corpus, tmp_path, init, "data.directions=[en-de,en-fr]",
        f"data.tag_placement={placement}", "trainer.max_steps=4",
    )  # fmt: skip
    side = "target" if placement == "target" else "source"
    with pytest.raises(ConfigError) as err:
        train(compose_train(overrides, tmp_path))
    assert str(err.value) == (
        f"init_from={init}: its tokenizer lacks the language tags <2de>, <2fr> that "
        f"data.directions with data.tag_placement={placement} needs as {side} pieces; start "
        f"from a multilingual litmt checkpoint trained with these directions, or train from "
        f"scratch (drop init_from)"
    )
    assert "\n" not in str(err.value)
    assert not list(tmp_path.rglob("*.ckpt"))  # refused at setup: nothing trained or saved
    assert not list(tmp_path.rglob("src.ids"))  # nor any split tokenised


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_multilingual_checkpoint_passes_and_a_new_language_is_named(placement, tmp_path):
    init = read_init_checkpoint(build_tiny_multilingual_checkpoint(tmp_path, placement, steps=2))
    check_language_tags(init, parse_directions(["en-de", "en-fr"]), placement)  # no error
    check_language_tags(init, [], placement)  # a one-pair run: nothing to check
    with pytest.raises(ConfigError, match=r"lacks the language tags <2cs> that data\.direc"):
        check_language_tags(init, parse_directions(["en-de", "en-cs", "fr-cs"]), placement)


def test_an_imported_marian_checkpoint_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.hf_models import make_marian_dir

    init = read_init_checkpoint(make_marian_dir(tmp_path / "marian"))
    with pytest.raises(ConfigError, match=r"lacks the language tags <2de>, <2fr> that"):
        check_language_tags(init, parse_directions(["en-de", "en-fr"]), "source")


def test_the_check_reads_the_placements_side(tmp_path):
    """Source placement reads the source pieces, target placement the target pieces."""
    init = read_init_checkpoint(build_tiny_multilingual_checkpoint(tmp_path, "target", steps=2))
    init.tokenizer.src_tags = {}  # as if only the target vocabulary held the tags
    check_language_tags(init, parse_directions(["en-de"]), "target")
    with pytest.raises(ConfigError, match=r"needs as source pieces"):
        check_language_tags(init, parse_directions(["en-de"]), "source")
