"""Forced decoding (`ForcedDecoder`, scripts/score.py): the numbers equal an independent float64 forward pass and the
ones beam search gives its own hypotheses; batching keeps the input order; the script."""

from __future__ import annotations

import copy
import math
import random
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tiny_checkpoint import corpus, tiny_checkpoint_path
from train_utils import REPO, script_env

from litmt import load_translator
from litmt.decoding.analysis.forced import ForcedDecoder
from litmt.decoding.search.beam import beam_search

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

ALPHA = 0.6  # a length penalty that is neither 0 nor 1, so the normalising length matters


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint_path(tmp_path_factory)


@pytest.fixture(scope="module")
def forced(ckpt):
    return ForcedDecoder(load_translator(ckpt, device="cpu"))


def _pairs(n: int = 24) -> tuple[list[str], list[str]]:
    """True pairs, pairs with another sentence's reference, and a pair with an empty target."""
    en, de = corpus()
    src, tgt = en[:n], de[:n]
    wrong = de[n : 2 * n]
    random.Random(1).shuffle(wrong)
    return [*src, *src[: n // 2], src[0]], [*tgt, *wrong[: n // 2], ""]


def reference_scores(
    forced: ForcedDecoder, sources: list[str], targets: list[str], alpha: float
) -> list[tuple[float, float]]:
    """(total, normalised) per pair, one pair at a time, from a float64 copy of the model:
    log_softmax of a plain forward pass, gathered at y_1..y_n and eos."""
    tok = forced.translator.tokenizer
    model = copy.deepcopy(forced.translator.model).double().eval()
    out = []
    for s, t in zip(sources, targets, strict=True):
        src = torch.tensor([tok.encode_src([s])[0]])  # (1, S)
        y = tok.encode_tgt([t])[0]
        tgt_in = torch.tensor([[2, *y]])  # bos + y
        gold = torch.tensor([*y, 3])  # y + eos
        with torch.no_grad():
            logp = F.log_softmax(model(src, tgt_in)[0].double(), dim=-1)  # (T, V)
        total = float(logp[torch.arange(len(gold)), gold].sum())
        n = len(y) + 1  # eos counts in the length, as in litmt.decoding.search.beam
        out.append((total, total / ((5 + n) / 6) ** alpha))
    return out


def test_totals_equal_the_sum_of_float64_log_probabilities(forced):
    sources, targets = _pairs()
    found = forced.force_decode(
        sources, targets, length_penalty=ALPHA, max_tokens=60
    )  # many batches
    expected = reference_scores(forced, sources, targets, ALPHA)
    assert len(found) == len(expected)
    for r, (total, norm) in zip(found, expected, strict=True):
        assert r.log_prob == pytest.approx(total, abs=1e-4)
        assert r.score == pytest.approx(norm, abs=1e-4)
    # the true references score higher than another sentence's, so the numbers mean something
    true_mean = sum(r.score for r in found[:12]) / 12  # the same 12 sources both times
    wrong_mean = sum(r.score for r in found[24:36]) / 12
    assert true_mean > wrong_mean + 1.0


def test_scores_are_the_numbers_beam_search_gives_its_hypotheses(forced):
    tr = forced.translator
    en, _ = corpus()
    ids = [tr.prepare(s) for s in en[:6]]
    src = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)  # (B, S), pad 0
    for i, s in enumerate(ids):
        src[i, : len(s)] = torch.tensor(s)
    nbest = beam_search(tr.model, src, beam_size=4, n_best=3, length_penalty=ALPHA)
    sources = [ids[i] for i, hyps in enumerate(nbest) for _ in hyps]
    hyps = [h for row in nbest for h in row]
    found = forced.force_decode_ids(sources, [h.tokens for h in hyps], length_penalty=ALPHA)
    assert len(found) == len(hyps) >= 12
    for h, r in zip(hyps, found, strict=True):
        assert r.log_prob == pytest.approx(h.log_prob, abs=1e-4)
        assert r.score == pytest.approx(h.score, abs=1e-4)


def test_output_order_does_not_depend_on_batching(forced):
    sources, targets = _pairs()
    one_each = forced.force_decode(sources, targets, length_penalty=ALPHA, max_tokens=1)
    all_at_once = forced.force_decode(sources, targets, length_penalty=ALPHA, max_tokens=100_000)
    assert [r.log_prob for r in one_each] == pytest.approx([r.log_prob for r in all_at_once])
    assert len({round(r.log_prob, 3) for r in one_each}) > len(one_each) // 2  # not constant


def test_edge_conventions(forced, caplog):
    limit = forced.translator.model.config.max_positions - 1
    found = forced.force_decode_ids(
        [[], [], [5, 6], [5, 6]], [[], [7], [7] * (limit + 1), [7] * limit], length_penalty=1.0
    )
    assert (found[0].log_prob, found[0].score) == (0.0, 0.0)  # Translator: "" for "", no model
    assert found[1].log_prob == -math.inf and "empty source with a 1-subword target" in caplog.text
    assert found[2].log_prob == -math.inf and "more than the model's maximum" in caplog.text
    assert math.isfinite(found[3].log_prob)


def test_force_decoding_runs_under_the_translators_autocast(forced, monkeypatch):
    # a flash/te checkpoint on CUDA computes in half only: score in the Translator's autocast
    import contextlib

    import litmt.decoding.analysis.forced

    entered = []

    def spy(device, dtype):
        entered.append(dtype)
        return contextlib.nullcontext()

    monkeypatch.setattr(litmt.decoding.analysis.forced, "autocast_context", spy)
    monkeypatch.setattr(forced.translator, "autocast", torch.bfloat16)
    forced.force_decode_ids([[5, 6]], [[7]], length_penalty=1.0)
    assert entered == [torch.bfloat16]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_score_script_prints_one_line_per_pair_in_input_order(ckpt, forced, tmp_path):
    sources, targets = _pairs(12)
    src = _write(tmp_path / "src.en", sources)
    tgt = _write(tmp_path / "tgt.de", targets)
    cmd = [
        sys.executable, "scripts/score.py", f"ckpt_path={ckpt}", f"src_file={src}",
        f"tgt_file={tgt}", f"length_penalty={ALPHA}", "max_tokens=50", "device=cpu",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    expected = reference_scores(forced, sources, targets, ALPHA)
    assert len(lines) == len(expected)
    for line, (total, norm) in zip(lines, expected, strict=True):
        a, b = (float(x) for x in line.split("\t"))
        assert a == pytest.approx(total, abs=1e-4) and b == pytest.approx(norm, abs=1e-4)


def test_score_script_refuses_files_of_different_lengths(ckpt, tmp_path):
    src = _write(tmp_path / "src.en", ["A dog runs.", "A cat sleeps.", "A man eats."])
    tgt = _write(tmp_path / "tgt.de", ["Ein Hund rennt.", "Ein Kater schläft."])
    cmd = [
        sys.executable, "scripts/score.py", f"ckpt_path={ckpt}", f"src_file={src}",
        f"tgt_file={tgt}", "device=cpu",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "has 3 lines but tgt_file" in err[0] and "has 2" in err[0], err
    assert proc.stdout == ""
