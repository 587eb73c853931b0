"""conf/model/*.yaml: base.yaml holds every key; the others inherit it and override a few."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from litmt.models import TransformerConfig

CONF = Path(__file__).resolve().parents[3] / "conf"
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


def composed_model(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={name}"])
    return OmegaConf.to_container(cfg.model, resolve=True)


@pytest.mark.parametrize("name", MODELS)
def test_every_line_is_commented(name: str) -> None:
    for i, line in enumerate((CONF / "model" / f"{name}.yaml").read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            assert "#" in line, f"model/{name}.yaml:{i} has no comment: {line!r}"


@pytest.mark.parametrize("name", [m for m in MODELS if m != "base"])
def test_a_model_is_base_plus_its_own_keys(name: str) -> None:
    own = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml"))
    assert own.pop("defaults") == ["base", "_self_"]
    assert own, "a model config that overrides nothing is base.yaml"
    base = composed_model("base")
    assert set(own) <= set(base), f"model/{name}.yaml sets keys base.yaml lacks"
    assert composed_model(name) == {**base, **own}


@pytest.mark.parametrize("name", MODELS)
def test_every_model_config_builds_a_transformer_config(name: str) -> None:
    model = composed_model(name)  # every key is a TransformerConfig field
    cfg = TransformerConfig.from_dict({**model, "src_vocab_size": 100})
    assert cfg.d_model % cfg.n_heads == 0
