"""The distilled corpus's parts (`litmt.decoding.distill`): the filters and their counts, the
hypothesis kept (top, or Seq-Inter's closest to the reference), the cross-entropy filter over
the whole corpus, the chunked writer, resuming after a stop or a kill mid-chunk, and the
refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from litmt.decoding.distill import (
    MARKER_FILE,
    PROVENANCE_FILE,
    SCORES_PART,
    Candidate,
    DistillConfig,
    DistillOutput,
    FilterCounts,
    choose,
    distill_corpus,
    filter_pairs,
    worst,
)
from litmt.errors import ConfigError
from litmt.metrics import sentence_bleu

SETTINGS = {"teacher": [{"weights_sha256": "abc"}], "decoding": {"beam_size": 5}}
LINES = [f"a sentence number {i}" if i != 4 else "" for i in range(10)]  # line 4: empty


def teach(line: str) -> str:
    return line.upper().replace("SENTENCE", "SATZ")


def test_each_filter_drops_and_counts_its_pairs() -> None:
    sources = ["A dog runs.", "", "A cat.", "A man walks.", "Hello  World", "A bird sings."]
    outputs = ["Ein Hund rennt.", "x", "   ", "Ein Mann geht. " * 5, "hello world", "Ein Vogel."]
    src_len = [4, 0, 3, 4, 2, 4]
    out_len = [4, 1, 0, 20, 2, 3]
    kept, counts = filter_pairs(sources, outputs, src_len, out_len, DistillConfig(max_ratio=3.0))
    assert kept == [0, 5]  # "A dog runs." and "A bird sings."
    assert counts == FilterCounts(read=6, kept=2, empty=2, bad_ratio=1, copy=1)


def test_filters_can_be_switched_off() -> None:
    settings = DistillConfig(max_ratio=float("inf"), drop_copies=False)
    kept, counts = filter_pairs(["a b", "same"], ["a " * 30, "Same"], [2, 1], [30, 1], settings)
    assert kept == [0, 1] and counts == FilterCounts(read=2, kept=2)


def test_top_keeps_the_best_and_closest_the_hypothesis_nearest_the_reference() -> None:
    ref = "ein kleiner Hund rennt schnell über die grüne Wiese ."
    row = [
        Candidate("ein Hund läuft .", 4, 0.5),  # the teacher's best
        Candidate("ein kleiner Hund rennt über die Wiese .", 8, 0.9),  # the closest
        Candidate("Hund .", 2, 1.5),
    ]
    far = [Candidate("Katzen schlafen", 2, 0.2), Candidate("Katzen spielen", 2, 0.4)]
    bleu = [sentence_bleu(c.text, ref) for c in row]
    assert bleu[1] > bleu[0] > bleu[2]  # the case: the closest is not the top one
    assert choose([row, far], [ref, ref], "top") == [row[0], far[0]]
    # ties (both 0 BLEU against the reference) keep the better-ranked hypothesis
    assert choose([row, far], [ref, ref], "closest") == [row[1], far[0]]


def test_worst_is_exactly_the_quantile_of_highest_cross_entropies() -> None:
    scores = [0.5, 2.0, 0.1, 3.0, 0.7, 2.0, 0.2, 0.3, 0.4, 0.6]
    assert worst(scores, 0.0) == set()
    assert worst(scores, 0.1) == {3}
    assert worst(scores, 0.2) == {3, 1}  # a tie at 2.0: the earlier line first
    assert worst(scores, 0.3) == {3, 1, 5}
    assert worst(scores, 0.29) == {3, 1}  # floor(2.9): never more than the share
    assert worst([0.0] * 100, 0.29) == set(range(29))  # 0.29 * 100 is 28.999... in floats


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="chunk_lines must be >= 1"):
        DistillConfig(chunk_lines=0)
    with pytest.raises(ConfigError, match="max_ratio must be >= 1"):
        DistillConfig(max_ratio=0.5)
    with pytest.raises(ConfigError, match=r"max_ratio must be a number >= 1 or \.inf, got 'x'"):
        DistillConfig(max_ratio="x")
    with pytest.raises(ConfigError, match=r"^select must be top or closest, got 'best'$"):
        DistillConfig(select="best")
    with pytest.raises(ConfigError, match=r"filter_ce_quantile must be in \[0, 1\)"):
        DistillConfig(filter_ce_quantile=1.0)
    # the docs' spelling: `max_ratio=.inf` arrives from the command line as a string
    assert DistillConfig(max_ratio=".inf").max_ratio == float("inf")


def cross_entropy(line: str) -> float:
    """The fake teacher's per-token cross-entropy of its translation of `line`: its number
    (line 9 worst, then 7, 8, ...; lines 5 and 1 tie)."""
    number = int(line.split()[-1]) if line else 0
    return {9: 5.0, 7: 4.0, 8: 3.0, 5: 2.0, 1: 2.0}.get(number, 0.1 * number)


def fake_teacher(calls: list[str]):
    """Translates each line with `teach` (its best) and a lowercase variant (its second);
    records what it translated."""

    def translate(sources: list[str]) -> tuple[list[list[Candidate]], list[int]]:
        calls.extend(sources)
        candidates = [
            [
                Candidate(teach(s), len(s.split()), cross_entropy(s)),
                Candidate(teach(s).lower(), len(s.split()), cross_entropy(s) + 1),
            ]
            for s in sources
        ]
        return candidates, [len(s.split()) for s in sources]

    return translate


def run(
    out: Path, calls: list[str], refs: list[str] | None = None, **settings
) -> tuple[bool, DistillOutput]:
    config = DistillConfig(out=str(out), chunk_lines=3, progress=False, **settings)
    output = DistillOutput(out, ("en", "de"), SETTINGS)
    assert output.finished() is None
    output.open_parts()
    refs = refs or LINES
    chunks = [(LINES[i : i + 3], refs[i : i + 3]) for i in range(0, len(LINES), 3)]
    complete = distill_corpus(chunks, fake_teacher(calls), output, config, len(LINES))
    if complete:
        output.finish({"format": 1}, config.filter_ce_quantile)
    return complete, output


def test_a_stopped_run_resumes_to_the_uninterrupted_output(tmp_path: Path) -> None:
    whole: list[str] = []
    assert run(tmp_path / "whole", whole)[0]
    calls: list[str] = []
    complete, output = run(tmp_path / "kd", calls, max_chunks=2)
    assert not complete and calls == LINES[:6]
    assert json.loads((tmp_path / "kd" / MARKER_FILE).read_text())["chunks"] == 2
    # a kill in the middle of the next chunk's write: bytes past the marker's lengths
    with output.part("de").open("a", encoding="utf-8") as f:
        f.write("A HALF-WRITTEN LI")
    calls.clear()
    complete, _ = run(tmp_path / "kd", calls)
    assert complete and calls == LINES[6:]  # the done chunks are not translated again
    for lang in ("en", "de"):
        got = (tmp_path / "kd" / f"train.{lang}").read_text(encoding="utf-8")
        assert got == (tmp_path / "whole" / f"train.{lang}").read_text(encoding="utf-8")
    assert got == "".join(f"{teach(s)}\n" for s in LINES if s)
    assert not (tmp_path / "kd" / MARKER_FILE).exists()
    assert sorted(p.name for p in (tmp_path / "kd").iterdir()) == [
        PROVENANCE_FILE, "train.de", "train.en",
    ]  # fmt: skip
    done = json.loads((tmp_path / "kd" / PROVENANCE_FILE).read_text())
    assert done["counts"] == {
        "read": 10, "kept": 9, "empty": 1, "bad_ratio": 0, "copy": 0, "cross_entropy": 0,
    }  # fmt: skip
    assert done["settings"] == SETTINGS


def test_closest_keeps_the_candidate_nearest_each_reference(tmp_path: Path) -> None:
    # references in lowercase: the teacher's second candidate is the closer one
    refs = [teach(s).lower() for s in LINES]
    assert run(tmp_path / "top", [], refs)[0]
    assert run(tmp_path / "closest", [], refs, select="closest")[0]
    kept = [s for s in LINES if s]
    top = (tmp_path / "top" / "train.de").read_text(encoding="utf-8").splitlines()
    closest = (tmp_path / "closest" / "train.de").read_text(encoding="utf-8").splitlines()
    assert top == [teach(s) for s in kept]
    assert closest == [teach(s).lower() for s in kept]


def test_the_cross_entropy_filter_drops_the_worst_share_of_the_whole_corpus(tmp_path) -> None:
    # 9 pairs pass the other filters (line 4 is empty); 0.25 of them: the 2 worst, lines 9, 7,
    # in different chunks; a stop and a kill on the way change nothing
    whole: list[str] = []
    assert run(tmp_path / "whole", whole, filter_ce_quantile=0.25)[0]
    calls: list[str] = []
    assert not run(tmp_path / "kd", calls, filter_ce_quantile=0.25, max_chunks=3)[0]
    with (tmp_path / "kd" / SCORES_PART).open("a", encoding="utf-8") as f:
        f.write("0.12")  # killed while writing the next chunk's scores
    assert run(tmp_path / "kd", calls, filter_ce_quantile=0.25)[0]
    expected = [s for i, s in enumerate(LINES) if s and i not in (7, 9)]
    for out in (tmp_path / "whole", tmp_path / "kd"):
        assert (out / "train.en").read_text(encoding="utf-8").splitlines() == expected
        assert (out / "train.de").read_text(encoding="utf-8").splitlines() == [
            teach(s) for s in expected
        ]
        done = json.loads((out / PROVENANCE_FILE).read_text())
        assert done["counts"] == {
            "read": 10, "kept": 7, "empty": 1, "bad_ratio": 0, "copy": 0, "cross_entropy": 2,
        }  # fmt: skip
        assert not (out / SCORES_PART).exists() and not (out / MARKER_FILE).exists()


def test_a_finished_corpus_is_not_redone_and_other_settings_are_refused(tmp_path: Path) -> None:
    assert run(tmp_path, [])[0]
    assert DistillOutput(tmp_path, ("en", "de"), SETTINGS).finished() is not None
    other = {**SETTINGS, "decoding": {"beam_size": 2}}
    with pytest.raises(ConfigError, match=r"a corpus distilled with other settings \(differs in: "
                       r"decoding\)"):  # fmt: skip
        DistillOutput(tmp_path, ("en", "de"), other).finished()


def test_an_unfinished_run_with_other_settings_is_refused(tmp_path: Path) -> None:
    assert not run(tmp_path, [], max_chunks=1)[0]
    other = {**SETTINGS, "teacher": [{"weights_sha256": "def"}]}
    with pytest.raises(ConfigError, match=r"an unfinished distillation .*differs in: teacher\)"):
        DistillOutput(tmp_path, ("en", "de"), other).finished()


def test_a_directory_of_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("a real corpus\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds train\.en but no distill\.json"):
        DistillOutput(tmp_path, ("en", "de"), SETTINGS).refuse_foreign()
    assert (tmp_path / "train.en").read_text(encoding="utf-8") == "a real corpus\n"
