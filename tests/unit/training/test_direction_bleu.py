"""Per-direction validation BLEU of a multilingual model: `valid/bleu_<direction>` for each
direction and `valid/bleu` as their mean (what selects checkpoints); a one-pair corpus logs
`valid/bleu` alone, as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from litmt.metrics import corpus_scores
from litmt.training.callbacks.validation_bleu import ValidationBleu

REFS = ["ein hund läuft", "eine katze sitzt", "un chien court", "un chat est assis"]
HYPS = ["ein hund läuft", "eine katze", "un chien", "un chat est assis"]


def _run(spans: list[tuple[str, int, int]] | None) -> dict[str, float]:
    logged: dict[str, float] = {}
    dm = SimpleNamespace(
        references=lambda split: REFS,
        direction_spans=lambda split: spans,
        forced_prefixes=lambda split, indices: None,
    )
    trainer = SimpleNamespace(datamodule=dm, sanity_checking=False, loggers=[])
    pl_module = SimpleNamespace(log=lambda name, value, **kw: logged.__setitem__(name, value))
    scorer = ValidationBleu(splits=["valid"])
    scorer.on_validation_epoch_start(trainer, pl_module)  # type: ignore[arg-type]
    scorer._pairs["valid"].extend(enumerate(HYPS))
    scorer.on_validation_epoch_end(trainer, pl_module)  # type: ignore[arg-type]
    return logged


def test_each_direction_is_scored_and_the_mean_is_valid_bleu() -> None:
    logged = _run([("en-de", 0, 2), ("en-fr", 2, 4)])
    de = corpus_scores(HYPS[:2], REFS[:2], metrics=("bleu",))["bleu"].score
    fr = corpus_scores(HYPS[2:], REFS[2:], metrics=("bleu",))["bleu"].score
    assert de != fr
    assert logged["valid/bleu_en-de"] == pytest.approx(de)
    assert logged["valid/bleu_en-fr"] == pytest.approx(fr)
    assert logged["valid/bleu"] == pytest.approx((de + fr) / 2)
    assert {"valid/chrf", "valid/chrf_en-de", "valid/chrf_en-fr"} <= set(logged)


def test_one_pair_logs_corpus_bleu_only() -> None:
    logged = _run(None)
    assert set(logged) == {"valid/bleu", "valid/chrf"}
    assert logged["valid/bleu"] == pytest.approx(corpus_scores(HYPS, REFS)["bleu"].score)


def test_validation_forces_the_target_side_language_token() -> None:
    """With ``data.tag_placement=target`` each example's decoding starts with its
    direction's token (the datamodule's `forced_prefixes`, by example index)."""
    import torch

    calls: list[dict] = []
    dm = SimpleNamespace(
        references=lambda split: REFS,
        direction_spans=lambda split: [("en-de", 0, 2), ("en-fr", 2, 4)],
        forced_prefixes=lambda split, indices: [[7] if i < 2 else [8] for i in indices],
    )

    def model(src, config, sync_steps=False, **kwargs):
        calls.append(kwargs)
        return [[5] for _ in range(src.size(0))]

    trainer = SimpleNamespace(datamodule=dm, sanity_checking=False, loggers=[], model=model,
                              strategy=None)  # fmt: skip
    tokenizer = SimpleNamespace(decode_tgt=lambda ids: ["x" for _ in ids])
    pl_module = SimpleNamespace(trainer=trainer, tokenizer=tokenizer)
    scorer = ValidationBleu(splits=["valid"])
    scorer.on_validation_epoch_start(trainer, pl_module)  # type: ignore[arg-type]
    batch = {"src": torch.zeros(3, 4, dtype=torch.long), "index": torch.tensor([3, 0, 2])}
    scorer.hypotheses(pl_module, batch, "valid")  # type: ignore[arg-type]
    assert calls == [{"prefixes": [[8], [7], [8]]}]
