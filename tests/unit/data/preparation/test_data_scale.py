"""Corpora larger than memory: streamed preparation, the memory-mapped cache, shards, dedup,
the bounded tokenizer sample and the one-line errors of bad input."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from tiny_corpora import make_pairs

from litmt.data import TranslationDataModule
from litmt.data.batching.sampler import TokenBudgetBatchSampler
from litmt.data.corpora.parallel import HubSpec
from litmt.data.preparation.encoding import PairDeduper
from litmt.data.preparation.memmap import CacheWriter
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.data.tokenization.training_sample import sample_sentences
from litmt.errors import ConfigError, DataError


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")


def _train_cache(dm: TranslationDataModule) -> Path:
    return dm._cache_path("train", dm._get_tokenizer())


def _batches(dm: TranslationDataModule) -> list[list[int]]:
    return [b["index"].tolist() for b in dm.train_dataloader()]


def _mapped(arr: object) -> bool:
    """Whether `arr` is (a view of) a memory-mapped file, not a copy in memory."""
    while arr is not None:
        if isinstance(arr, np.memmap):
            return True
        arr = getattr(arr, "base", None)
    return False


def test_training_reads_memory_mapped_arrays(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.setup("fit")
    ds = dm.datasets["train"]
    for arr in (ds.src_values, ds.tgt_values, ds.src_offsets, ds.indices, ds.src_lengths()):
        assert _mapped(arr)


def test_large_plans_are_file_backed_and_leave_no_files(
    dm_kwargs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above `FILE_MIN_ITEMS` the sampler's per-example arrays (lengths, costs, the epoch's
    order) are memory-mapped scratch files, not private memory; the batches are the same as
    with in-memory arrays, and the unlinked files leave nothing on disk."""
    from litmt.data.batching import scratch

    dm = TranslationDataModule(**dm_kwargs)
    in_memory = _batches(dm)
    monkeypatch.setattr(scratch, "FILE_MIN_ITEMS", 2)
    sampler = dm.train_dataloader().batch_sampler
    plan = sampler.rank_plan(0, 0, 1)
    for arr in (sampler.src_lengths, sampler.tgt_lengths, sampler.lengths, plan.order):
        assert scratch.is_file_backed(arr)
    assert _batches(dm) == in_memory
    assert list((Path(dm_kwargs["cache_dir"]) / "scratch").iterdir()) == []


def test_shards_by_glob_and_list_equal_one_file(tmp_path: Path, dm_kwargs: dict) -> None:
    src, tgt = make_pairs(300, seed=3)
    one, shards = tmp_path / "one", tmp_path / "shards"
    for d in (one, shards):
        d.mkdir()
        for split in ("valid", "test"):
            _write(d / f"{split}.en", src[:20])
            _write(d / f"{split}.de", tgt[:20])
    _write(one / "train.en", src)
    _write(one / "train.de", tgt)
    for i, (a, b) in enumerate(((0, 120), (120, 250), (250, 300))):
        _write(shards / f"train.{i:02d}.en", src[a:b])
        _write(shards / f"train.{i:02d}.de", tgt[a:b])
    kw = {**dm_kwargs, "filter": {"max_ratio": float("inf")}}
    ref = TranslationDataModule(**{**kw, "dir": str(one), "cache_dir": str(tmp_path / "c1")})
    glob = TranslationDataModule(
        **{**kw, "dir": str(shards), "cache_dir": str(tmp_path / "c2"),
           "splits": {"train": "train.*"}}
    )  # fmt: skip
    listed = TranslationDataModule(
        **{**kw, "dir": str(shards), "cache_dir": str(tmp_path / "c3"),
           "splits": {"train": ["train.00", "train.01", "train.02"]}}
    )  # fmt: skip
    for dm in (ref, glob, listed):
        dm.setup("fit")
    assert ref.references("train") == glob.references("train") == listed.references("train")
    assert _batches(ref) == _batches(glob) == _batches(listed)


def test_shard_line_count_mismatch_is_one_line(tmp_path: Path, dm_kwargs: dict) -> None:
    corpus = Path(dm_kwargs["dir"])
    _write(corpus / "train.en", [*make_pairs(10)[0], "one more"])
    _write(corpus / "train.de", make_pairs(10)[1])
    with pytest.raises(DataError) as exc:
        TranslationDataModule(**dm_kwargs).prepare_data()
    msg = str(exc.value)
    assert "\n" not in msg and "has 11 lines" in msg and "has 10" in msg


def test_corrupt_cache_is_one_line(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.prepare_data()
    path = _train_cache(dm)
    with (path / "src.ids").open("r+b") as f:
        f.truncate(2)
    with pytest.raises(DataError) as exc:
        TranslationDataModule(**dm_kwargs).setup("fit")
    assert "corrupt" in str(exc.value) and "src.ids" in str(exc.value)
    assert "\n" not in str(exc.value)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupt"):
        TranslationDataModule(**dm_kwargs).setup("fit")


def test_full_disk_is_one_line_and_leaves_no_cache(
    dm_kwargs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = CacheWriter._write

    def fail_later(self: CacheWriter, name: str, array: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] > 6:  # in the middle of the first chunk: a half-written cache
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, array)

    monkeypatch.setattr(CacheWriter, "_write", fail_later)
    dm = TranslationDataModule(**dm_kwargs)
    with pytest.raises(DataError) as exc:
        dm.prepare_data()
    assert str(exc.value).startswith("no space left on the device") and "\n" not in str(exc.value)
    cache = Path(dm_kwargs["cache_dir"]) / "cache"
    assert not any(cache.iterdir())  # neither the half-written directory nor a published one
    monkeypatch.setattr(CacheWriter, "_write", real)
    TranslationDataModule(**dm_kwargs).setup("fit")  # rebuilt from scratch


def test_half_written_cache_is_never_reused(dm_kwargs: dict, tmp_path: Path) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.prepare_data()
    path = _train_cache(dm)
    ref = _batches(TranslationDataModule(**dm_kwargs))
    # a crashed writer's temporary directory (a pid that does not run) and a published
    # directory whose completion marker is gone
    stale = path.with_name(path.name + ".tmp999999999")
    stale.mkdir()
    (path / "meta.json").unlink()  # the marker-less directory is rebuilt (test_cache_promises)
    assert _batches(TranslationDataModule(**dm_kwargs)) == ref
    assert (path / "meta.json").is_file()
    assert not stale.exists()  # the dead writer's directory was removed


def test_dedup_keeps_first_occurrences(tmp_path: Path, dm_kwargs: dict) -> None:
    corpus = Path(dm_kwargs["dir"])
    src, tgt = make_pairs(50, seed=9)
    src += [*src[:10], "x y"]
    tgt += [*tgt[:10], tgt[0]]  # same target, other source: not a duplicate
    _write(corpus / "train.en", src)
    _write(corpus / "train.de", tgt)
    expect = len({(s, t) for s, t in zip(src, tgt, strict=True)})
    kw = {**dm_kwargs, "filter": {"max_ratio": float("inf"), "dedup": True}}
    dm = TranslationDataModule(**kw)
    dm.setup("fit")
    c = dm.filter_counts
    assert c["kept"] == expect and c["duplicate"] == len(src) - expect
    idx = np.asarray(dm.datasets["train"].indices)
    pairs = [(src[i], tgt[i]) for i in idx]
    assert len(set(pairs)) == len(pairs) and idx.max() == len(src) - 1  # "x y" kept
    assert TranslationDataModule(**kw).tokenizer_dir() == dm.tokenizer_dir()
    assert _train_cache(TranslationDataModule(**dm_kwargs)) != _train_cache(dm)  # keyed


def test_pair_deduper_across_chunks() -> None:
    d = PairDeduper()
    seen: set[int] = set()
    rng = np.random.default_rng(0)
    for _ in range(30):
        h = rng.integers(0, 500, 40).astype(np.uint64)
        cand = rng.random(40) < 0.9
        new = d.first_seen(h, cand)
        expect = np.zeros(40, dtype=bool)
        for i, v in enumerate(h.tolist()):
            if cand[i] and v not in seen:
                expect[i] = True
                seen.add(v)
        assert (new == expect).all()


@pytest.mark.parametrize("joint", [True, False])
def test_streamed_sample_trains_the_same_tokenizer(
    tmp_path: Path, joint: bool, caplog: pytest.LogCaptureFixture
) -> None:
    src, tgt = make_pairs(400, seed=5)
    src[7] = ""  # empty sentences are skipped on both paths
    settings = TokenizerConfig(vocab_size=40, joint=joint, input_sentence_size=250, seed=3)
    ref = Tokenizer.train(src, tgt, settings)

    def chunks():
        for a in range(0, 400, 64):
            yield src[a : a + 64], tgt[a : a + 64]

    with caplog.at_level(logging.INFO, logger="litmt.data"):
        samples = sample_sentences(chunks, joint=joint, size=250, seed=3, workdir=tmp_path / "w")
    assert [len(s) for s in samples] == [250] * (1 if joint else 2)
    total = 799 if joint else 399
    assert f"tokenizer: sampled 250 of {total} sentences" in caplog.text
    got = Tokenizer.train(samples[0], samples[-1], settings, sampled=True)
    assert got.to_dict() == ref.to_dict()


def test_sample_size_zero_takes_every_sentence_like_sentencepiece(tmp_path: Path) -> None:
    src, tgt = make_pairs(50, seed=6)
    src[3] = ""

    def chunks():
        yield src, tgt

    everything = sample_sentences(chunks, joint=True, size=0, seed=1, workdir=tmp_path / "a")
    assert list(everything[0]) == [s for s in src if s] + tgt  # corpus order, no empty one
    larger = sample_sentences(chunks, joint=True, size=1000, seed=1, workdir=tmp_path / "b")
    assert list(larger[0]) == list(everything[0])


def test_sampler_plans_the_same_from_memory_mapped_or_file_backed_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from litmt.data.batching import scratch

    rng = np.random.default_rng(1)
    s, t = rng.integers(1, 60, 5000), rng.integers(2, 60, 5000)
    np.asarray(s, dtype=np.int32).tofile(tmp_path / "s")
    np.asarray(t, dtype=np.int32).tofile(tmp_path / "t")
    ms = np.memmap(tmp_path / "s", dtype=np.int32, mode="r")
    mt = np.memmap(tmp_path / "t", dtype=np.int32, mode="r")
    monkeypatch.setattr(scratch, "FILE_MIN_ITEMS", 1000)
    for world in (1, 2):
        for rank in range(world):
            a = TokenBudgetBatchSampler(s.tolist(), t.tolist(), max_tokens=300, seed=4,
                                        rank=rank, world_size=world)  # fmt: skip
            b = TokenBudgetBatchSampler(ms, mt, max_tokens=300, seed=4, rank=rank,
                                        world_size=world, scratch_dir=tmp_path / "plan")  # fmt: skip
            assert _mapped(b.src_lengths)  # read in place, not copied
            assert scratch.is_file_backed(b.lengths) and not scratch.is_file_backed(a.lengths)
            assert list(a) == list(b)


def test_scratch_in_a_read_only_directory_falls_back_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from litmt.data.batching import scratch

    def read_only(**kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(scratch.tempfile, "mkstemp", read_only)
    with caplog.at_level(logging.WARNING, logger="litmt.data"):
        arr = scratch.Scratch(tmp_path, min_items=1).empty(10, np.int32)
    assert len(arr) == 10 and not scratch.is_file_backed(arr)
    assert "keeping the plan in memory" in caplog.text


def test_scratch_full_disk_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from litmt.data.batching import scratch

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(scratch.os, "posix_fallocate", full)
    with pytest.raises(DataError) as exc:
        scratch.Scratch(tmp_path, min_items=1).empty(10, np.int32)
    assert "no space left" in str(exc.value) and "\n" not in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_hub_streaming_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as exc:
        HubSpec(path="wmt/wmt14", streaming=True)
    assert "memory-mapped cache" in str(exc.value) and "\n" not in str(exc.value)


def test_cache_key_follows_the_input_files(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.prepare_data()
    before = _train_cache(dm)
    f = Path(dm_kwargs["dir"]) / "train.de"
    f.write_text(f.read_text(encoding="utf-8").replace("hund", "katze", 1), encoding="utf-8")
    assert _train_cache(TranslationDataModule(**dm_kwargs)) != before
    meta = json.loads((before / "meta.json").read_text())
    assert meta["pairs"] == meta["filter_counts"]["kept"]


def test_chunked_counting_sort_equals_the_lexsort(monkeypatch: pytest.MonkeyPatch) -> None:
    from litmt.data.batching import plan as batch_plan

    rng = np.random.default_rng(2)
    s, t = rng.integers(0, 40, 3000).astype(np.int32), rng.integers(1, 41, 3000).astype(np.int32)
    order = rng.permutation(3000).astype(np.int32)
    whole = batch_plan.bucket_sort(order, s, t)  # one chunk: the lexsort
    monkeypatch.setattr(batch_plan, "_SORT_CHUNK", 257)  # many chunks: the counting sort
    chunked = batch_plan.bucket_sort(order, s, t)
    assert (whole == chunked).all()
    ss, tt = s[whole], t[whole]
    cost = np.maximum(ss, tt)
    assert (np.diff(cost) >= 0).all()
