"""Bad input gives a one-line `DataError` naming the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from tiny_corpora import TINY_TOKENIZER

from litmt.data import ParallelCorpus, TranslationDataModule
from litmt.errors import ConfigError, DataError


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")


def test_line_counts_differ(tmp_path: Path) -> None:
    write(tmp_path / "train.en", ["a", "b", "c"])
    write(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", dir=tmp_path).load("train")
    msg = one_line(exc)
    assert f"{tmp_path / 'train.en'} has 3 lines but {tmp_path / 'train.de'} has 2" in msg


def test_missing_file_of_a_split(tmp_path: Path) -> None:
    write(tmp_path / "train.en", ["a"])
    write(tmp_path / "train.de", ["x"])
    corpus = ParallelCorpus("en", "de", dir=tmp_path, splits={"test": "test2016"})
    with pytest.raises(DataError) as exc:
        corpus.load("test")
    msg = one_line(exc)
    assert f"missing file {tmp_path / 'test2016.en'} for the 'test' split" in msg
    assert "data.splits.test=STEM" in msg
    write(tmp_path / "test2016.en", ["a"])
    with pytest.raises(DataError, match=r"missing file .*test2016\.de"):
        corpus.load("test")


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", dir=tmp_path / "nope")
    assert f"data directory {tmp_path / 'nope'} does not exist" in one_line(exc)


def test_missing_hub_split(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_load(*args: object, split: str, **kw: object) -> None:
        raise ValueError(f"Unknown split \"{split}\". Should be one of ['train', 'test'].")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    corpus = ParallelCorpus("en", "de", hub={"path": "org/corpus"})
    with pytest.raises(DataError) as exc:
        corpus.load("valid")
    msg = one_line(exc)
    assert "hub dataset org/corpus has no split 'validation'" in msg
    assert "data.hub.splits.valid=NAME" in msg


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("", encoding="utf-8")
    (tmp_path / "train.de").write_text("", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", dir=tmp_path).load("train")
    assert "are empty" in one_line(exc) and str(tmp_path / "train.en") in str(exc.value)


def test_empty_after_filtering(tmp_path: Path) -> None:
    for split in ("train", "valid", "test"):
        write(tmp_path / f"{split}.en", ["a b c"] * 5)
        write(tmp_path / f"{split}.de", [""] * 5)
    dm = TranslationDataModule(
        dir=str(tmp_path),
        cache_dir=str(tmp_path / "c"),
        tokenizer=TINY_TOKENIZER | {"vocab_size": 8},
    )
    with pytest.raises(DataError) as exc:
        dm.setup("fit")
    assert "no training pairs left after filtering 5" in one_line(exc)


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "train.en", ["a", "b", "c"])
    (tmp_path / "train.de").write_bytes(b"x\ny\nstra\xdfe\n")  # latin-1 sharp s on line 3
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", dir=tmp_path).load("train")
    msg = one_line(exc)
    assert f"{tmp_path / 'train.de'}: invalid UTF-8 at line 3" in msg


def jsonl_corpus(tmp_path: Path, row: dict, tgt: str, layout: str = "columns") -> ParallelCorpus:
    """An en→`tgt` corpus whose train.jsonl holds one `row`."""
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    return ParallelCorpus(
        "en", tgt, dir=tmp_path, format="jsonl", layout=layout, hf_cache_dir=str(tmp_path / "hf")
    )


def test_unknown_column(tmp_path: Path) -> None:
    corpus = jsonl_corpus(tmp_path, {"en": "a", "fr": "b"}, "de")
    with pytest.raises(DataError) as exc:
        corpus.load("train")
    msg = one_line(exc)
    assert str(tmp_path / "train.jsonl") in msg
    assert "no column 'de' for language 'de' (columns: en, fr)" in msg
    assert "data.columns.de=COLUMN" in msg


def test_unknown_language_in_translation_column(tmp_path: Path) -> None:
    row = {"translation": {"en": "a", "de": "b"}}
    corpus = jsonl_corpus(tmp_path, row, "fr", layout="translation")
    with pytest.raises(DataError) as exc:
        corpus.load("train")
    msg = one_line(exc)
    assert "language 'fr' not in column 'translation' (languages: en, de)" in msg
    assert str(tmp_path / "train.jsonl") in msg


def test_missing_translation_column(tmp_path: Path) -> None:
    corpus = jsonl_corpus(tmp_path, {"en": "a", "de": "b"}, "de", layout="translation")
    with pytest.raises(DataError, match=r"no column 'translation' \(columns: en, de\)"):
        corpus.load("train")


def test_bad_tsv_row(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("en\tde\na\tb\nc\td\te\n", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", dir=tmp_path, format="tsv").load("train")
    assert f"{tmp_path / 'train.tsv'}: line 3 has 3 tab-separated fields" in one_line(exc)


def test_offline_uncached_hub_dataset_explains_local_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True, raising=False)
    corpus = ParallelCorpus(
        "en", "de", hub={"path": "litmt-test/not-cached-anywhere"},
        hf_cache_dir=str(tmp_path / "hf"),
    )  # fmt: skip
    with pytest.raises(DataError) as exc:
        corpus.load("train")
    msg = one_line(exc)
    assert "hub dataset litmt-test/not-cached-anywhere is not in the local cache" in msg
    assert "data.dir=PATH" in msg and "{split}.en" in msg


def test_unknown_format_and_layout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown data.format 'csv'"):
        ParallelCorpus("en", "de", dir=tmp_path, format="csv")
    with pytest.raises(ConfigError, match=r"unknown data.layout 'rows'"):
        ParallelCorpus("en", "de", dir=tmp_path, layout="rows")


def test_unknown_settings_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown data.tokenizer keys \['vocab'\]"):
        TranslationDataModule(dir=str(tmp_path), tokenizer={"vocab": 8})
    with pytest.raises(ConfigError, match=r"unknown data.filter keys \['maxlen'\]"):
        TranslationDataModule(dir=str(tmp_path), filter={"maxlen": 8})


def test_unknown_hub_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_load(*args: object, **kw: object) -> None:
        raise datasets.exceptions.DatasetNotFoundError(
            "Dataset 'org/typo' doesn't exist on the Hub"
        )

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    with pytest.raises(DataError) as exc:
        ParallelCorpus("en", "de", hub={"path": "org/typo"}).load("train")
    assert "hub dataset 'org/typo' not found; check data.hub.path" in one_line(exc)


def test_missing_test_split_only_fails_when_testing(tmp_path: Path) -> None:
    for split in ("train", "valid"):
        write(tmp_path / f"{split}.en", ["a b", "c d e"] * 20)
        write(tmp_path / f"{split}.de", ["x y", "z w v"] * 20)
    dm = TranslationDataModule(
        dir=str(tmp_path),
        cache_dir=str(tmp_path / "c"),
        tokenizer=TINY_TOKENIZER | {"vocab_size": 20},
    )
    dm.prepare_data()
    dm.setup("fit")
    with pytest.raises(DataError) as exc:
        dm.setup("test")
    assert f"missing file {tmp_path / 'test.en'} for the 'test' split" in one_line(exc)
