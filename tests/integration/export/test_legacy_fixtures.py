"""Files written by litmt 0.1 before the re-layout (issue 22) still load and translate the same.

`tests/fixtures/legacy_v0_1/` holds a checkpoint and its CTranslate2 export made by main before
the package moved, and the translations (greedy, beam 3) each engine gave then
(`make_fixtures.py` says how). Only the public entry point `litmt.load_translator` is used, so
this test does not change when modules move.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import litmt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "legacy_v0_1"
RECORD = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("engine", ["torch", "ct2"])
@pytest.mark.parametrize("setting", sorted(RECORD["settings"]))
def test_legacy_files_translate_as_recorded(engine: str, setting: str) -> None:
    if engine == "ct2":
        pytest.importorskip("ctranslate2")
        path, extra = FIXTURES / "ct2", {"threads": 1}
    else:
        path, extra = FIXTURES / "tiny.ckpt", {}
    translator = litmt.load_translator(path, engine=engine, device="cpu", **extra)
    got = translator.translate(
        RECORD["sentences"], return_scores=True, **RECORD["settings"][setting]
    )
    expected = RECORD["expected"][engine][setting]
    assert [t for [(t, _)] in got] == [t for t, _ in expected]
    assert [s for [(_, s)] in got] == pytest.approx([s for _, s in expected], abs=1e-4)
