"""benchmarks/benchmark.py: a smoke run end to end, and the pieces it trusts (decode loops,
memory measurement, matched model sizes, the doc section writer).

Marian comes from `transformers`, which the ``dev`` extra installs: these tests run in CI
rather than skip (a missing package is an error here, not a skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import corpus

from benchmarks import benchmark as bm
from benchmarks import peers
from litmt.errors import LitmtError

REPO = Path(__file__).resolve().parents[3]


SIZE = peers.Size("test", 32, 4, 2)


def toy_layout(root: Path) -> Path:
    """A copy of ``benchmarks/`` in ``root/repo`` with a synthetic corpus where it looks for
    Multi30k (``root/repo/../shared/data/multi30k``), so the smoke run needs no real data.

    Returns:
        The copy's repository root (run ``python -m benchmarks.benchmark`` in it).
    """
    shutil.copytree(REPO / "benchmarks", root / "repo" / "benchmarks")
    data = root / "shared" / "data" / "multi30k"
    data.mkdir(parents=True)
    en, de = corpus()
    for split, lines in (("train", slice(0, 400)), ("valid", slice(400, 450))):
        for lang, text in (("en", en), ("de", de)):
            (data / f"{split}.{lang}").write_text("\n".join(text[lines]) + "\n", encoding="utf-8")
    for lang, text in (("en", en), ("de", de)):
        (data / f"test2016.{lang}").write_text("\n".join(text[450:]) + "\n", encoding="utf-8")
    return root / "repo"


@pytest.mark.slow
def test_smoke_run_writes_all_tables(tmp_path):
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\nHand-written notes stay.\n")
    repo = toy_layout(tmp_path)
    cmd = [sys.executable, "-m", "benchmarks.benchmark", "--smoke", "--out", str(out)]
    cmd += ["--cache", str(tmp_path / "cache"), "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written notes stay.\n")
    assert text.count(bm.BEGIN) == 1 and text.count(bm.END) == 1
    for needle in ("#### Training", "#### Decoding", "| greedy | marian |", "| beam 3 | litmt |"):
        assert needle in text
    for model in ("litmt", "marian", "nn.Transformer"):
        assert f"| {model} | " in text
    assert "Command: `python -m benchmarks.benchmark --smoke" in text


def test_unknown_size_is_a_one_line_error():
    with pytest.raises(LitmtError) as err:
        bm.parse_args(["--sizes", "small,huge"])
    assert str(err.value) == "unknown size(s) ['huge']; valid: small, base, tiny"


def test_the_three_models_have_the_same_size():
    counts = {
        name: sum(p.numel() for p in build(SIZE, 100, 0.1).parameters() if p.requires_grad)
        for name, build in peers.BUILDERS.items()
    }
    # Identical but for Marian's post-norm layout (no final encoder/decoder LayerNorm).
    assert counts["litmt"] == counts["nn.Transformer"]
    assert counts["litmt"] - counts["marian"] == 4 * SIZE.d_model


def test_all_three_train_on_the_same_batch():
    torch.manual_seed(0)
    batch = bm.Batch(
        torch.randint(4, 100, (3, 6)), torch.randint(4, 100, (3, 5)), torch.randint(4, 100, (3, 5))
    )
    for name, build in peers.BUILDERS.items():
        step = peers.make_train_step(name, build(SIZE, 100, 0.0).train())
        first = step(batch)
        for _ in range(5):
            last = step(batch)
        assert torch.isfinite(first) and last < first, name


def test_beam_of_one_is_greedy_and_lengths_are_forced():
    torch.manual_seed(0)
    model = peers.build_litmt(SIZE, 100, 0.0).eval()
    src = torch.randint(4, 100, (3, 7))
    src[1, 5:] = peers.PAD_ID
    greedy = peers.litmt_greedy(model, src, 9)
    assert torch.equal(peers.litmt_beam(model, src, 1, 9), greedy)
    beam = peers.litmt_beam(model, src, 4, 9)
    assert beam.shape == (3, 9) and not (beam == peers.EOS_ID).any()


def test_forced_length_beam_finds_the_brute_force_best_on_a_tiny_vocabulary():
    """V=12, N=3 tokens then the forced eos, beam 6: the library's objective log P(y, eos)
    over all 11³ eos-free sequences has its maximum where the benchmark's beam ends (a fixed
    instance on which greedy does worse, so the search is really exercised)."""
    torch.manual_seed(1)
    model = peers.build_litmt(peers.Size("t", 16, 2, 1), 12, 0.0).eval()
    src = torch.tensor([[4, 5, 4, 7]])
    best = peers.litmt_beam(model, src, 6, 3)[0].tolist()
    greedy = peers.litmt_greedy(model, src, 3)[0].tolist()
    assert len(best) == 3 and peers.EOS_ID not in best

    def score(seq: list[int]) -> float:  # log P(seq, eos | src), by a full forward pass
        tgt_in = torch.tensor([[peers.BOS_ID, *seq]])
        logp = model(src, tgt_in).log_softmax(-1)[0]
        return float(sum(logp[i, t] for i, t in enumerate([*seq, peers.EOS_ID])))

    with torch.no_grad():
        tokens = [t for t in range(12) if t != peers.EOS_ID]
        brute = max(([a, b, c] for a in tokens for b in tokens for c in tokens), key=score)
        assert score(best) == pytest.approx(score(brute), abs=1e-5)
        assert score(greedy) < score(best) - 1e-3


def test_marian_generate_is_forced_to_the_length():
    torch.manual_seed(0)
    model = peers.build_marian(SIZE, 100, 0.0).eval()
    src = torch.randint(4, 100, (2, 6))
    for beam in (1, 3):
        out = peers.marian_generate(model, src, beam, 7)
        assert out.shape == (2, 7) and not (out == peers.EOS_ID).any()


def test_peak_tensor_memory_sees_a_temporary():
    def work() -> None:
        a = torch.ones(2**20)  # 4 MiB
        b = a * 2  # another 4 MiB while a lives
        del a, b

    peak = bm.peak_tensor_memory(work, torch.device("cpu"))
    assert 8 * 2**20 <= peak < 9 * 2**20


def test_write_section_replaces_only_its_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n")
    bm.write_section(doc, "first")
    doc.write_text(doc.read_text() + "\noutro\n")
    bm.write_section(doc, "second")
    text = doc.read_text()
    assert text == f"intro\n\n{bm.BEGIN}\nsecond\n{bm.END}\noutro\n"
