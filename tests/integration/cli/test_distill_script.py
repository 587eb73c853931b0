"""scripts/distill.py end to end on the tiny teacher: the distilled corpus and its provenance, a
stopped and killed run resumed to the uninterrupted output, the one-line refusals, Seq-Inter
(select=closest), the cross-entropy filter and an ensemble teacher's outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus, mean_weights, other_weights, save_weights

from litmt.checkpoint.io import weights_digest
from litmt.decoding.distill import worst
from litmt.decoding.translator import Translator
from litmt.deploy.loader import load_translator
from litmt.metrics import sentence_bleu

REPO = Path(__file__).resolve().parents[3]
N = 40  # tiny-corpus lines: the first N template sentences, line 7 left empty


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """``train.{en,de}``: N template pairs, the source of line 7 empty."""
    root = tmp_path_factory.mktemp("corpus")
    en, de = corpus()
    en = [s if i != 7 else "" for i, s in enumerate(en[:N])]
    (root / "train.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    (root / "train.de").write_text("\n".join(de[:N]) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def ct2_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ct2")


def distill(ckpt: Path, data: Path, out: Path, ct2_cache: Path, *overrides: str):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    args = [f"ckpt_path={ckpt}", f"data.dir={data}", f"out={out}", f"ct2_cache_dir={ct2_cache}"]
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "distill.py"), *args, "chunk_lines=16", *overrides],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


def test_distill_writes_the_corpus_and_its_provenance(ckpt, data, ct2_cache, tmp_path) -> None:
    proc = distill(ckpt, data, tmp_path / "kd", ct2_cache)
    assert proc.returncode == 0, proc.stderr
    assert "distill: 100%" in proc.stderr and "40/40" in proc.stderr  # the progress bar
    assert "distilled 39 of 40 pairs" in proc.stderr and "1 empty" in proc.stderr
    src = (tmp_path / "kd" / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (tmp_path / "kd" / "train.de").read_text(encoding="utf-8").splitlines()
    en = (data / "train.en").read_text(encoding="utf-8").splitlines()
    assert src == [s for s in en if s]
    teacher = load_translator(
        str(ckpt), engine="ct2", compute_type="int8", quantization="int8", ct2_cache_dir=ct2_cache
    )
    assert tgt == teacher.translate(src, beam_size=5)  # the teacher's int8 beam-5 output
    assert tgt != (data / "train.de").read_text(encoding="utf-8").splitlines()[:39]
    done = json.loads((tmp_path / "kd" / "distill.json").read_text(encoding="utf-8"))
    assert done["teacher"]["models"] == [
        {"path": str(ckpt), "weights_sha256": weights_digest(ckpt)}
    ]
    assert done["settings"]["engine"] == {
        "engine": "ct2",
        "compute_type": "int8",
        "quantization": "int8",
    }
    assert done["settings"]["decoding"]["method"] == "beam"
    assert done["settings"]["decoding"]["beam_size"] == 5
    assert done["source"]["dir"] == str(data) and done["source"]["split"] == "train"
    assert done["counts"] == {
        "read": 40, "kept": 39, "empty": 1, "bad_ratio": 0, "copy": 0, "cross_entropy": 0,
    }  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "kd").iterdir()) == [
        "distill.json", "train.de", "train.en",
    ]  # fmt: skip

    again = distill(ckpt, data, tmp_path / "kd", ct2_cache)  # finished: nothing to redo
    assert again.returncode == 0 and "already distilled" in again.stderr
    other = distill(ckpt, data, tmp_path / "kd", ct2_cache, "beam_size=2")
    assert other.returncode == 2
    assert other.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'kd'} holds a corpus distilled with other settings (differs in: "
        "decoding); rerun with those settings, or choose another out= directory"
    ]


def test_a_stopped_and_killed_run_resumes_to_the_same_corpus(ckpt, data, ct2_cache, tmp_path):
    whole = distill(ckpt, data, tmp_path / "whole", ct2_cache, "progress=false")
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "kd"
    first = distill(ckpt, data, out, ct2_cache, "max_chunks=1", "progress=false")
    assert first.returncode == 0, first.stderr
    assert "stopped after 1 chunk(s)" in first.stderr and not (out / "train.de").exists()
    with (out / "train.de.part").open("a", encoding="utf-8") as f:
        f.write("Ein halb geschriebe")  # as if killed in the middle of the next chunk's write
    changed = distill(ckpt, data, out, ct2_cache, "max_ratio=2", "progress=false")
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines() == [
        f"error: {out} holds an unfinished distillation with other settings (differs in: "
        "filters); rerun with those settings, or choose another out= directory"
    ]
    rest = distill(ckpt, data, out, ct2_cache, "progress=false")
    assert rest.returncode == 0, rest.stderr
    for name in ("train.en", "train.de"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    done = json.loads((out / "distill.json").read_text(encoding="utf-8"))
    assert done["counts"]["read"] == 40 and done["counts"]["kept"] == 39


def test_user_errors_are_one_line(ckpt, data, ct2_cache, tmp_path) -> None:
    missing = distill(tmp_path / "nope.ckpt", data, tmp_path / "kd", ct2_cache)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: checkpoint not found: {tmp_path / 'nope.ckpt'} (pass ckpt_path=<path to a "
        ".ckpt file>)"
    ]
    two = distill(f"[{ckpt},{ckpt}]", data, tmp_path / "kd", ct2_cache)  # type: ignore[arg-type]
    assert two.returncode == 2
    assert (
        two.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: engine=ct2 decodes one teacher; for an ensemble teacher pass engine=torch "
            "ensemble=true"
        )
    )
    into_data = distill(ckpt, data, data, ct2_cache)
    assert into_data.returncode == 2
    assert into_data.stderr.strip().splitlines() == [
        f"error: {data} holds train.en, train.de but no distill.json: not a distilled corpus; "
        "choose an empty out= directory"
    ]
    assert not (tmp_path / "kd").exists()


def test_an_ensemble_teacher_decodes_on_the_torch_engine(ckpt, data, ct2_cache, tmp_path):
    proc = distill(
        f"[{ckpt},{ckpt}]",  # type: ignore[arg-type]
        data,
        tmp_path / "kd",
        ct2_cache,
        "engine=torch",
        "ensemble=true",
        "device=cpu",
        "data.limit=8",
        "progress=false",
    )
    assert proc.returncode == 0, proc.stderr
    assert "compute_type=int8" not in proc.stderr  # the YAML's int8 keys are ct2-only: unused
    done = json.loads((tmp_path / "kd" / "distill.json").read_text(encoding="utf-8"))
    assert done["teacher"]["combine"] == "ensemble" and len(done["teacher"]["models"]) == 2
    assert done["settings"]["engine"]["engine"] == "torch"
    assert done["counts"]["read"] == 8 and done["counts"]["kept"] == 7


def int8_teacher(ckpt: Path, ct2_cache: Path):
    return load_translator(
        str(ckpt), engine="ct2", compute_type="int8", quantization="int8", ct2_cache_dir=ct2_cache
    )


def read(out: Path, name: str) -> list[str]:
    return (out / name).read_text(encoding="utf-8").splitlines()


def as_distilled(data: Path, decode) -> tuple[list[str], list]:
    """The non-empty source lines and `decode` of them, decoded in distill's chunks of 16
    lines (chunk_lines=16: the same batches, so the same int8 numbers)."""
    lines = read(data, "train.en")
    src, found = [], []
    for i in range(0, len(lines), 16):
        chunk = [s for s in lines[i : i + 16] if s]
        src += chunk
        found += decode(chunk)
    return src, found


def test_select_closest_keeps_the_n_best_hypothesis_nearest_the_reference(
    ckpt, data, ct2_cache, tmp_path
) -> None:
    teacher = int8_teacher(ckpt, ct2_cache)
    src, nbest = as_distilled(data, lambda c: teacher.translate(c, beam_size=5, n_best=4))
    # references that are the teacher's second-best translations: closest must pick those
    second = iter(row[1][0] for row in nbest)
    alt = tmp_path / "alt"
    alt.mkdir()
    (alt / "train.en").write_text((data / "train.en").read_text(encoding="utf-8"), "utf-8")
    refs = [next(second) if s else "" for s in read(data, "train.en")]
    (alt / "train.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    proc = distill(ckpt, alt, tmp_path / "kd", ct2_cache, "select=closest", "n_best=4",
                   "max_ratio=inf", "drop_copies=false", "progress=false")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read(tmp_path / "kd", "train.en") == src
    tgt = read(tmp_path / "kd", "train.de")
    assert tgt == [row[1][0] for row in nbest]  # not the top
    assert all(row[0][0] != row[1][0] for row in nbest)
    by_source = dict(zip(read(alt, "train.en"), refs, strict=True))
    assert tgt == [
        max((text for text, _ in row), key=lambda t, r=by_source[s]: sentence_bleu(t, r))
        for s, row in zip(src, nbest, strict=True)
    ]
    done = json.loads((tmp_path / "kd" / "distill.json").read_text(encoding="utf-8"))
    assert done["settings"]["select"] == "closest"
    assert done["settings"]["decoding"]["n_best"] == 4

    top = distill(ckpt, data, tmp_path / "top", ct2_cache, "n_best=4", "progress=false")
    assert top.returncode == 2
    assert (
        top.stderr.strip()
        .splitlines()[-1]
        .startswith("error: distill keeps one translation per line: n_best=1, or select=closest")
    )
    one = distill(ckpt, data, tmp_path / "one", ct2_cache, "select=closest", "progress=false")
    assert one.returncode == 2
    assert one.stderr.strip().splitlines()[-1] == (
        "error: select=closest chooses among the teacher's n-best: pass n_best=N (2 or more, at "
        "most beam_size)"
    )


def test_the_cross_entropy_filter_drops_the_pairs_the_teacher_scores_worst(
    ckpt, data, ct2_cache, tmp_path
) -> None:
    proc = distill(ckpt, data, tmp_path / "kd", ct2_cache, "filter_ce_quantile=0.25",
                   "progress=false")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "distilled 30 of 40 pairs" in proc.stderr and "9 cross-entropy" in proc.stderr
    teacher = int8_teacher(ckpt, ct2_cache)
    src, found = as_distilled(data, lambda c: teacher.translations(c, beam_size=5))
    scores = [-row[0].log_prob / (row[0].length + 1) for row in found]
    dropped = worst(scores, 0.25)
    assert len(dropped) == 9  # floor(0.25 * 39)
    assert read(tmp_path / "kd", "train.en") == [s for i, s in enumerate(src) if i not in dropped]
    assert read(tmp_path / "kd", "train.de") == [
        row[0].text for i, row in enumerate(found) if i not in dropped
    ]
    assert min(scores[i] for i in dropped) >= max(
        s for i, s in enumerate(scores) if i not in dropped
    )
    done = json.loads((tmp_path / "kd" / "distill.json").read_text(encoding="utf-8"))
    assert done["counts"]["cross_entropy"] == 9 and done["counts"]["kept"] == 30
    assert done["settings"]["filters"]["ce_quantile"] == 0.25


def test_an_ensemble_teacher_gives_the_ensemble_s_translations(
    ckpt, data, ct2_cache, tmp_path
) -> None:
    # a second member: halfway between the trained weights and a random initialisation
    noise = other_weights(ckpt, tmp_path / "random.ckpt", seed=3)
    half = save_weights(ckpt, mean_weights([ckpt, noise]), tmp_path / "half.ckpt")
    proc = distill(
        f"[{ckpt},{half}]",  # type: ignore[arg-type]
        data, tmp_path / "kd", ct2_cache, "engine=torch", "ensemble=true", "device=cpu",
        "max_ratio=inf", "drop_copies=false", "progress=false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tgt = read(tmp_path / "kd", "train.de")
    ensemble = Translator.from_checkpoint([ckpt, half], device="cpu", ensemble=True)
    assert tgt == as_distilled(data, lambda c: ensemble.translate(c, beam_size=5))[1]
    for member in (ckpt, half):  # the ensemble's output is neither member's alone
        alone = Translator.from_checkpoint(member, device="cpu")
        assert tgt != as_distilled(data, lambda c, t=alone: t.translate(c, beam_size=5))[1]
