"""Each command reads its own keys through one dataclass (`litmt.config.job_config`): the
composed YAML gives the real defaults, null is None where a field takes it and refused in one
line where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from litmt.cli.average import AverageConfig
from litmt.cli.finalize import FinalizeConfig, FinalizeOverrides
from litmt.cli.import_hf import ImportHFConfig
from litmt.cli.visualize import VisualizeConfig
from litmt.config import job_config
from litmt.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"


def composed(name: str, overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("average_checkpoints", AverageConfig),
        ("import_hf", ImportHFConfig),
        ("visualize_attention", VisualizeConfig),
        ("finalize", FinalizeConfig),
    ],
)
def test_the_composed_yaml_gives_the_dataclass_defaults(name, cls) -> None:
    settings = job_config(cls, composed(name), name)
    if cls is FinalizeConfig:  # the block is read on its own (finalize_run)
        assert composed(name).finalize == {k: None for k in FinalizeOverrides.__dataclass_fields__}
        return
    assert settings == cls()


def test_a_null_that_needs_a_value_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        job_config(ImportHFConfig, composed("import_hf", ["force=null"]), "import_hf")
    assert str(err.value) == (
        "import_hf.force cannot be null; give it a value or drop the key to keep its default "
        "(default false)"
    )
    with pytest.raises(ConfigError, match=r"^visualize_attention\.dpi cannot be null"):
        job_config(
            VisualizeConfig, composed("visualize_attention", ["dpi=null"]), "visualize_attention"
        )


def test_visualize_kinds() -> None:
    cfg = composed("visualize_attention", ["kind=[cross,encoder]", "layers=[0,-1]"])
    settings = job_config(VisualizeConfig, cfg, "visualize_attention")
    assert settings.kinds() == ["cross", "encoder"] and settings.layers == [0, -1]
    bad = job_config(VisualizeConfig, composed("visualize_attention", ["kind=crosss"]), "v")
    with pytest.raises(ConfigError, match=r"^unknown attention kind 'crosss'; valid kinds: "):
        bad.kinds()
