"""The distilled corpus's parts (`litmt.decoding.distill`): the filters and their counts, the
chunked writer, resuming after a stop or a kill mid-chunk, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from litmt.decoding.distill import (
    MARKER_FILE,
    PROVENANCE_FILE,
    DistillConfig,
    DistillOutput,
    FilterCounts,
    distill_corpus,
    filter_pairs,
)
from litmt.errors import ConfigError

SETTINGS = {"teacher": [{"weights_sha256": "abc"}], "decoding": {"beam_size": 5}}
LINES = [f"a sentence number {i}" if i != 4 else "" for i in range(10)]  # line 4: empty


def teach(line: str) -> str:
    return line.upper().replace("SENTENCE", "SATZ")


def test_each_filter_drops_and_counts_its_pairs() -> None:
    sources = ["A dog runs.", "", "A cat.", "A man walks.", "Hello  World", "A bird sings."]
    outputs = ["Ein Hund rennt.", "x", "   ", "Ein Mann geht. " * 5, "hello world", "Ein Vogel."]
    src_len = [4, 0, 3, 4, 2, 4]
    out_len = [4, 1, 0, 20, 2, 3]
    kept_src, kept_out, counts = filter_pairs(
        sources, outputs, src_len, out_len, DistillConfig(max_ratio=3.0)
    )
    assert kept_src == ["A dog runs.", "A bird sings."]
    assert kept_out == ["Ein Hund rennt.", "Ein Vogel."]
    assert counts == FilterCounts(read=6, kept=2, empty=2, bad_ratio=1, copy=1)


def test_filters_can_be_switched_off() -> None:
    settings = DistillConfig(max_ratio=float("inf"), drop_copies=False)
    _, kept, counts = filter_pairs(["a b", "same"], ["a " * 30, "Same"], [2, 1], [30, 1], settings)
    assert kept == ["a " * 30, "Same"] and counts == FilterCounts(read=2, kept=2)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="chunk_lines must be >= 1"):
        DistillConfig(chunk_lines=0)
    with pytest.raises(ConfigError, match="max_ratio must be >= 1"):
        DistillConfig(max_ratio=0.5)
    with pytest.raises(ConfigError, match=r"max_ratio must be a number >= 1 or \.inf, got 'x'"):
        DistillConfig(max_ratio="x")
    # the docs' spelling: `max_ratio=.inf` arrives from the command line as a string
    assert DistillConfig(max_ratio=".inf").max_ratio == float("inf")


def fake_teacher(calls: list[str]):
    """Translates each line with `teach`; records what it translated."""

    def translate(sources: list[str]) -> tuple[list[str], list[int], list[int]]:
        calls.extend(sources)
        outputs = [teach(s) for s in sources]
        return outputs, [len(s.split()) for s in sources], [len(o.split()) for o in outputs]

    return translate


def run(out: Path, calls: list[str], **settings) -> tuple[bool, DistillOutput]:
    config = DistillConfig(out=str(out), chunk_lines=3, progress=False, **settings)
    output = DistillOutput(out, ("en", "de"), SETTINGS)
    assert output.finished() is None
    output.open_parts()
    chunks = [LINES[i : i + 3] for i in range(0, len(LINES), 3)]
    complete = distill_corpus(chunks, fake_teacher(calls), output, config, len(LINES))
    if complete:
        output.finish({"format": 1})
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
    done = json.loads((tmp_path / "kd" / PROVENANCE_FILE).read_text())
    assert done["counts"] == {"read": 10, "kept": 9, "empty": 1, "bad_ratio": 0, "copy": 0}
    assert done["settings"] == SETTINGS


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
