"""The settings reference (docs/reference/settings.md) is generated from the code and
cannot drift: it equals what `reports.settings_reference` renders now, names every settings
dataclass that conf/ mirrors, and changes when a field's doc changes."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from reports import settings_reference as ref

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_what_the_code_renders() -> None:
    assert ref.PAGE.read_text(encoding="utf-8") == ref.render(), (
        "docs/reference/settings.md is stale: python -m reports.settings_reference"
    )


def test_every_mirrored_dataclass_has_a_section() -> None:
    spec = importlib.util.spec_from_file_location(
        "config_defaults", ROOT / "tests" / "unit" / "test_config_defaults.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    mirrored = {case.cls for case in module.CASES}
    documented = {spec for *_, spec in ref.DATACLASS_SECTIONS}
    assert mirrored <= documented, mirrored - documented


def test_a_field_doc_reaches_the_page() -> None:
    from litmt.decoding.config import DecodeConfig

    page = ref.render()
    for f in dataclasses.fields(DecodeConfig):
        assert f"| `decoding.{f.name}` |" in page
    assert "| `serve.port`" not in page and "| `port` | `5000` | TCP port |" in page
