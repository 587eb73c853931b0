"""Target prefixes on the ct2 engine against the torch engine (tiny model); constraints are
refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from parity import SCORE_ATOL  # noqa: E402
from tiny_checkpoint import corpus, tiny_checkpoint_path  # noqa: E402

from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.engines.ct2 import CT2Translator  # noqa: E402
from litmt.deploy.export.ct2 import export_model  # noqa: E402
from litmt.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> tuple[Translator, CT2Translator]:
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    export_dir: Path = export_model(ckpt, tmp_path_factory.mktemp("ct2") / "float32")
    return Translator.from_checkpoint(ckpt, device="cpu"), CT2Translator(export_dir, threads=1)


def _prefixed(n: int) -> tuple[list[str], list[str | None], list[str]]:
    en, de = corpus(seed=5)
    prefixes: list[str | None] = [" ".join(d.split()[:2]) for d in de[:n]]
    prefixes[::5] = [None] * len(prefixes[::5])  # rows without a prefix in the same batch
    prefixes[1::7] = ["Ein alter Vogel"] * len(prefixes[1::7])  # ones the model would not say
    return en[:n], prefixes, de[:n]


@pytest.mark.parametrize(
    "options",
    [dict(beam_size=1), dict(beam_size=4, n_best=2), dict(beam_size=4, length_penalty=0.0)],
)
def test_prefix_gives_the_same_output_on_both_engines(engines, options):
    """Same tokens (except at a near-tie of the torch search), same litmt scores (prefix
    log-probabilities included on both), and every output starts with its prefix."""
    torch_engine, ct2_engine = engines
    en, prefixes, _ = _prefixed(60)
    pids, _ = torch_engine.encode_steering(len(en), prefixes)
    ids = [torch_engine.prepare(s) for s in en]
    ref = torch_engine.search_ids(ids, prefixes=pids, **options)
    got = ct2_engine.search_ids(ids, prefixes=pids, **options)
    for p, a, b in zip(pids, ref, got, strict=True):
        assert all(h.tokens[: len(p)] == p for h in b)
        mine = {tuple(h.tokens): h for h in a}
        for h in b:
            if tuple(h.tokens) in mine:
                assert h.log_prob == pytest.approx(mine[tuple(h.tokens)].log_prob, abs=SCORE_ATOL)
                assert h.score == pytest.approx(mine[tuple(h.tokens)].score, abs=SCORE_ATOL)
    tokens = [[[h.tokens for h in hyps] for hyps in r] for r in (ref, got)]
    differ = sum(x != y for x, y in zip(*tokens, strict=True))
    assert differ <= 0.05 * len(ids), f"{differ} of {len(ids)} differ"


def test_prefix_equal_to_the_reference_reproduces_it_on_ct2(engines):
    _, ct2_engine = engines
    en, _, de = _prefixed(30)
    assert ct2_engine.translate(en, prefixes=de, beam_size=4) == de
    short = ct2_engine.translate(en[:4], prefixes=de[:4], beam_size=4, max_len_a=0.0, max_len_b=2)
    assert short == de[:4]  # the budget is raised to hold the prefix, as on torch


def test_ct2_refuses_constraints_with_one_line(engines):
    _, ct2_engine = engines
    with pytest.raises(
        ConfigError, match=r"^engine=ct2 cannot apply terminology constraints"
    ) as err:
        ct2_engine.translate(["A red dog runs."], constraints=[["Hund"]])
    assert "\n" not in str(err.value)
    # no constraints at all (or only empty lists) is fine: the plain translation
    plain = ct2_engine.translate(["A red dog runs."])
    assert plain[0]
    assert ct2_engine.translate(["A red dog runs."], constraints=[[]]) == plain
    assert ct2_engine.translate(["A red dog runs."], constraints=None) == plain
