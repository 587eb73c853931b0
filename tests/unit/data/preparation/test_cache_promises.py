"""Two promises of the prepared cache, through the DataModule's own path (issue 42 item 6):
a cache directory without its completion marker is rebuilt, never reused; de-duplication
drops only pairs identical on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_corpora import make_pairs

from litmt.data import TranslationDataModule

ARRAYS = ("src.ids", "tgt.ids", "src.off", "tgt.off", "src.len", "tgt.len", "index")


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")


def _train_cache(cache_dir: str) -> Path:
    """The one published token-id cache of the train split (`{cache_dir}/cache/...-train-KEY`)."""
    found = [p for p in (Path(cache_dir) / "cache").glob("*-train-*") if "." not in p.name]
    assert len(found) == 1, found
    return found[0]


def _arrays(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in ARRAYS}


def test_cache_without_marker_is_rebuilt_not_reused(
    dm_kwargs: dict, caplog: pytest.LogCaptureFixture
) -> None:
    TranslationDataModule(**dm_kwargs).prepare_data()
    path = _train_cache(dm_kwargs["cache_dir"])
    ref, meta = _arrays(path), json.loads((path / "meta.json").read_text())
    ref_refs = TranslationDataModule(**dm_kwargs).references("train")
    # a damaged directory: the marker gone, a file overwritten with the same size (reusing
    # it, even after writing a new marker, would pass every size check but give wrong ids)
    (path / "meta.json").unlink()
    (path / "src.ids").write_bytes(bytes(len(ref["src.ids"])))
    (path / "index").write_bytes(np.arange(len(ref["index"]) // 8)[::-1].tobytes())

    dm = TranslationDataModule(**dm_kwargs)
    dm.prepare_data()
    assert _train_cache(dm_kwargs["cache_dir"]) == path  # published in place
    assert json.loads((path / "meta.json").read_text()) == meta
    assert _arrays(path) == ref
    assert "no completion marker" in caplog.text
    dm.setup("fit")
    ds = dm.datasets["train"]
    assert np.array_equal(np.asarray(ds.src_values), np.frombuffer(ref["src.ids"], np.uint16))
    assert dm.references("train") == ref_refs
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(path.name + ".")]
    assert leftovers == []  # neither the new one's temporary directory nor the old one


def test_dedup_drops_only_pairs_identical_on_both_sides(dm_kwargs: dict) -> None:
    corpus = Path(dm_kwargs["dir"])
    unique = list(dict.fromkeys(zip(*make_pairs(80, seed=4), strict=True)))[:40]
    src, tgt = [s for s, _ in unique], [t for _, t in unique]
    s0, t0 = src[0], tgt[0]
    extra = [
        (s0, t0 + " hund"),  # the source seen with another target: stays
        (s0 + " hund", t0),  # the target seen with another source: stays
        (s0, t0),  # identical on both sides: dropped
        ("ein", "dermann"),  # new ...
        ("einder", "mann"),  # ... and the same text split elsewhere between the sides: stays
        ("einder", "mann"),  # identical: dropped
        (t0, s0),  # the sides swapped: stays
    ]
    src += [s for s, _ in extra]
    tgt += [t for _, t in extra]
    _write(corpus / "train.en", src)
    _write(corpus / "train.de", tgt)
    dupes = {40 + 2, 40 + 5}
    assert len({(s, t) for s, t in zip(src, tgt, strict=True)}) == len(src) - len(dupes)

    kw = {**dm_kwargs, "filter": {"max_ratio": float("inf"), "max_len": 1000, "dedup": True}}
    dm = TranslationDataModule(**kw)
    dm.setup("fit")
    kept = sorted(np.asarray(dm.datasets["train"].indices).tolist())
    assert kept == [i for i in range(len(src)) if i not in dupes]
    assert dm.filter_counts["duplicate"] == len(dupes)
    assert dm.filter_counts["kept"] == len(src) - len(dupes)
