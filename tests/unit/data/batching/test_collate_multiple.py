"""Batch lengths padded to a multiple (issue 16 item 3): FP8 GEMMs need B*S and B*T divisible
by 8 (transformer_engine/pytorch/utils.py `assert_dim_for_fp8_exec`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from litmt.data import TranslationDataModule
from litmt.data.batching.collate import collate
from litmt.errors import ConfigError
from litmt.runtime.fp8 import pad_multiple_for


def _examples(lengths: list[tuple[int, int]]) -> list:
    rng = np.random.default_rng(0)
    return [
        (i, rng.integers(4, 50, s).astype(np.int32), rng.integers(4, 50, t).astype(np.int32))
        for i, (s, t) in enumerate(lengths)
    ]


def fp8_rows_ok(x: torch.Tensor) -> bool:
    """TE's rule on the rows of a (B, T, D) projection input: prod(leading dims) % 8 == 0."""
    return math.prod(x.shape[:-1]) % 8 == 0


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_padding_to_8_meets_the_fp8_row_rule_and_changes_nothing_else(batch: int) -> None:
    examples = _examples([(3 + 2 * i, 5 + i) for i in range(batch)])
    plain, padded = collate(examples), collate(examples, pad_to_multiple=8)
    b, s = padded["src"].shape
    t = padded["tgt_in"].size(1)
    assert s % 8 == 0 and t % 8 == 0
    hidden = torch.zeros(b, s, 16)  # (B, S, D): what the encoder projections see
    assert fp8_rows_ok(hidden) and fp8_rows_ok(torch.zeros(b, t, 16))
    for key in ("src", "tgt_in", "tgt_out", "src_padding_mask", "tgt_padding_mask"):
        w = plain[key].size(1)
        assert torch.equal(padded[key][:, :w], plain[key])
        tail = padded[key][:, w:]
        assert bool(tail.all()) if key.endswith("mask") else bool((tail == 0).all())
    for key in ("src_lengths", "tgt_lengths", "index"):
        assert torch.equal(padded[key], plain[key])
    assert padded["ntokens"] == plain["ntokens"]


def test_default_pads_only_to_the_batch_maximum() -> None:
    batch = collate(_examples([(3, 5), (6, 2)]))
    assert batch["src"].shape == (2, 6) and batch["tgt_in"].shape == (2, 6)


def test_datamodule_batches_are_padded_and_stay_within_the_token_budget(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**{**dm_kwargs, "max_tokens": 96}, pad_to_multiple=8)
    dm.setup("fit")
    n = 0
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for batch in loader:
            b, s = batch["src"].shape
            t = batch["tgt_in"].size(1)
            assert s % 8 == 0 and t % 8 == 0
            if loader.batch_sampler.max_tokens is not None and b > 1:
                assert b * max(s, t) <= loader.batch_sampler.max_tokens  # padding included
            n += 1
    assert n > 2


def test_bad_multiple_is_a_config_error(dm_kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=r"data\.pad_to_multiple must be >= 1 or null, got 0"):
        TranslationDataModule(**dm_kwargs, pad_to_multiple=0)


@pytest.mark.parametrize(
    ("precision", "configured", "want"),
    [
        ("transformer-engine", 1, 8),
        ("transformer-engine-float16", 1, 8),
        ("transformer-engine", 16, 16),
        ("transformer-engine", 3, 24),
        ("bf16-mixed", 1, 1),
        ("32-true", 4, 4),
    ],
)
def test_fp8_precision_sets_the_multiple_automatically(precision, configured, want) -> None:
    assert pad_multiple_for(precision, configured) == want
