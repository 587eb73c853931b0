"""Export parity on a real Multi30k checkpoint (checks/hf_parity.py): transformers' greedy
output equals litmt's on >= 99 % of test2016, max |Δlogit| < 1e-4, and export -> import gives
identical translations.

Slow (the whole test set, twice): point ``LITMT_HF_PARITY_CKPT`` at a checkpoint trained with
``experiment=multi30k_cpu`` (en->de), or a multilingual one (every direction from en, each with
its model-card call; the figures are the worst direction's); skipped without it or without
../shared/data/multi30k.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.common import MULTI30K
from checks.hf_parity import main

CKPT = os.environ.get("LITMT_HF_PARITY_CKPT")


@pytest.mark.slow
@pytest.mark.skipif(not CKPT, reason="set LITMT_HF_PARITY_CKPT to a Multi30k checkpoint")
@pytest.mark.skipif(not (MULTI30K / "test2016.en").is_file(), reason="needs Multi30k")
def test_export_parity_on_test2016(tmp_path, capsys):
    assert main(["--ckpt", str(CKPT), "--out", str(tmp_path / "hf"), "--round-trip"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["greedy_agreement"] >= 0.99
    assert report["max_abs_logit_diff"] < 1e-4
    assert report["round_trip_identical"] == report["round_trip_lines"] == report["lines"]
    assert (Path(tmp_path / "hf") / "README.md").is_file()
