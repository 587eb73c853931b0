"""Each corpus source loads into aligned `src`/`tgt` columns."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from tiny_corpora import make_pairs

from litmt.data import ParallelCorpus
from litmt.data.corpora.parallel import HubSpec
from litmt.data.text import read_text_file

SRC, TGT = make_pairs(20, seed=3)


def check(ds: datasets.Dataset, src: list[str] = SRC, tgt: list[str] = TGT) -> None:
    assert ds.column_names == ["src", "tgt"]
    assert ds["src"] == src and ds["tgt"] == tgt


def test_text_files_with_configurable_split_names(tmp_path: Path) -> None:
    (tmp_path / "test2016.en").write_text("\n".join(SRC) + "\n", encoding="utf-8")
    (tmp_path / "test2016.de").write_text("\r\n".join(TGT), encoding="utf-8")  # CRLF, no final \n
    corpus = ParallelCorpus("en", "de", dir=tmp_path, splits={"test": "test2016"})
    check(corpus.load("test"))
    reverse = ParallelCorpus("de", "en", dir=tmp_path, splits={"test": "test2016"})
    check(reverse.load("test"), TGT, SRC)  # direction is just the two codes


def test_text_lines_split_only_on_newline(tmp_path: Path) -> None:
    f = tmp_path / "x.en"
    f.write_text("one\u2028still one\n\nthree\n", encoding="utf-8")
    assert read_text_file(f, "x.en", strict=True) == ["one\u2028still one", "", "three"]


def test_tsv_with_header(tmp_path: Path) -> None:
    rows = ["de\ten\tid"] + [
        f"{t}\t{s}\t{i}" for i, (s, t) in enumerate(zip(SRC, TGT, strict=True))
    ]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    check(ParallelCorpus("en", "de", dir=tmp_path, format="tsv").load("train"))


def test_jsonl_columns_layout(tmp_path: Path) -> None:
    with (tmp_path / "valid.jsonl").open("w", encoding="utf-8") as f:
        for s, t in zip(SRC, TGT, strict=True):
            f.write(json.dumps({"english": s, "german": t}) + "\n")
    corpus = ParallelCorpus(
        "en", "de", dir=tmp_path, format="jsonl", columns={"en": "english", "de": "german"},
        hf_cache_dir=str(tmp_path / "hf"),
    )  # fmt: skip
    check(corpus.load("valid"))


def test_jsonl_translation_layout(tmp_path: Path) -> None:
    with (tmp_path / "train.jsonl").open("w", encoding="utf-8") as f:
        for s, t in zip(SRC, TGT, strict=True):
            f.write(json.dumps({"translation": {"de": t, "en": s}}) + "\n")
    corpus = ParallelCorpus(
        "de", "en", dir=tmp_path, format="jsonl", layout="translation",
        hf_cache_dir=str(tmp_path / "hf"),
    )  # fmt: skip
    check(corpus.load("train"), TGT, SRC)


def test_parquet_translation_layout(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict(
        {
            "translation": [{"en": s, "de": t} for s, t in zip(SRC, TGT, strict=True)],
            "extra": list(range(20)),
        }
    )
    ds.to_parquet(str(tmp_path / "test.parquet"))
    corpus = ParallelCorpus(
        "en", "de", dir=tmp_path, format="parquet", layout="translation",
        hf_cache_dir=str(tmp_path / "hf"),
    )  # fmt: skip
    check(corpus.load("test"))


def test_hub_layouts_through_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path calls `datasets.load_dataset(path, name, split=...)`; serve it locally."""
    columns = datasets.Dataset.from_dict({"en": SRC, "de": TGT})
    columns.to_parquet(str(tmp_path / "cols.parquet"))
    calls = []
    real_load = datasets.load_dataset

    def fake_load(
        path: str, name: str | None = None, *, split: str, **kw: object
    ) -> datasets.Dataset:
        calls.append((path, name, split))
        return real_load(
            "parquet", data_files=str(tmp_path / "cols.parquet"), split="train",
            cache_dir=str(tmp_path / "hf"),
        )  # fmt: skip

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    corpus = ParallelCorpus("en", "de", hub=HubSpec(path="bentrevett/multi30k"))
    check(corpus.load("valid"))
    assert calls == [("bentrevett/multi30k", None, "validation")]
    corpus = ParallelCorpus("de", "en", hub={"path": "x", "splits": {"test": "newstest"}})
    check(corpus.load("test"), TGT, SRC)
    assert calls[-1] == ("x", None, "newstest")


def test_fingerprint_tracks_file_changes(tmp_path: Path) -> None:
    for lang, lines in (("en", SRC), ("de", TGT)):
        (tmp_path / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = ParallelCorpus("en", "de", dir=tmp_path)
    before = corpus.fingerprint("train")
    assert corpus.fingerprint("train") == before
    (tmp_path / "train.de").write_text("\n".join(reversed(TGT)) + "\n\n", encoding="utf-8")
    assert corpus.fingerprint("train") != before
