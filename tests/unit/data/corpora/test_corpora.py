"""The one corpus interface (`litmt.data.corpora.interface.Corpora`): a one-pair corpus and a
multi-direction corpus answer the same questions, each in its own way."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_corpora import write_multi

from litmt.data.config import DataConfig
from litmt.data.corpora.interface import Corpora, PairCorpora
from litmt.data.corpora.multi import MultiCorpus, open_corpora
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.sources import TrainSource
from litmt.data.directions import parse_directions


def never() -> None:
    raise AssertionError("the tokenizer is needed only when a prefix is forced")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return write_multi(tmp_path / "c", {"train": 30, "valid": 6, "test": 4})


def multi(files: Path, placement: str, extra: list[TrainSource] | None = None) -> MultiCorpus:
    dirs = parse_directions(["en-de", "en-fr"])
    corpora = [ParallelCorpus(d.src, d.tgt, dir=files) for d in dirs]
    return MultiCorpus(dirs, corpora, placement, extra=extra or [])


def test_open_corpora_picks_the_kind(files: Path, tmp_path: Path) -> None:
    one = open_corpora(DataConfig(dir=str(files)), tmp_path / "hf")
    two = open_corpora(DataConfig(dir=str(files), directions=["en-de", "en-fr"]), tmp_path)
    assert isinstance(one, PairCorpora) and isinstance(two, MultiCorpus)
    assert isinstance(one, Corpora) and isinstance(two, Corpora)
    assert (two.main.src_lang, two.main.tgt_lang) == ("en", "de")


def test_one_pair_answers_without_directions(files: Path) -> None:
    pair = PairCorpora(ParallelCorpus("en", "de", dir=files))
    assert pair.direction_spans("valid") is None
    assert pair.forced_prefixes("valid", [0, 1], never) is None
    assert pair.languages_meta() == {} and pair.tags() == [] and pair.directions == []
    assert pair.scored() is pair.main
    assert pair.count("train") == 30 and pair.count("train", limit=7) == 7
    assert len(pair.load("train", limit=7)) == 7
    assert sum(len(s) for s, _ in pair.chunks("train", limit=7)) == 7


def test_several_directions_tag_count_and_span(files: Path) -> None:
    src_tagged, tgt_tagged = multi(files, "source"), multi(files, "target")
    assert src_tagged.count("train") == 60 and src_tagged.count("train", limit=7) == 14
    assert src_tagged.direction_spans("valid") == [("en-de", 0, 6), ("en-fr", 6, 12)]
    (src, tgt), *_ = src_tagged.chunks("valid")
    assert src[0].startswith("<2de> ") and not tgt[0].startswith("<2de>")
    (src, tgt), *_ = tgt_tagged.chunks("valid")
    assert tgt[0].startswith("<2de> ") and not src[0].startswith("<2de>")
    assert src_tagged.tags() == ["<2de>", "<2fr>"]
    assert tgt_tagged.languages_meta() == {"directions": ["en-de", "en-fr"],
                                           "tag_placement": "target"}  # fmt: skip
    assert [c.tgt_lang for c in src_tagged.scored()] == ["de", "fr"]


def test_forced_prefixes_only_with_target_placement(files: Path) -> None:
    tok = SimpleNamespace(tgt_tags={"<2de>": 7, "<2fr>": 9})  # what the prefixes read
    assert multi(files, "source").forced_prefixes("valid", [0, 7], never) is None
    assert multi(files, "target").forced_prefixes("valid", [0, 5, 6, 11], lambda: tok) == [
        [7], [7], [9], [9],
    ]  # fmt: skip


def test_extra_source_tags_come_first(files: Path) -> None:
    bt = TrainSource(ParallelCorpus("en", "fr", dir=files), tag="<BT>", name="bt", direction=1)
    corpora = multi(files, "source", extra=[bt])
    assert corpora.tags() == ["<BT>", "<2de>", "<2fr>"]
    assert corpora.count("train") == 90  # en-fr: its corpus, then the tagged extra source
    assert PairCorpora(ParallelCorpus("en", "de", dir=files), [bt]).tags() == ["<BT>"]
