"""`TranslationDataModule` end to end on a tiny corpus: caching, filters, batches, DDP eval."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from litmt.data import TranslationDataModule, collate
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID


def test_batches_follow_the_interface(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.src_lang, dm.tgt_lang) == ("en", "de")
    tok = dm.tokenizer
    assert tok is not None and tok.joint
    batch = next(iter(dm.train_dataloader()))
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.long
    assert tgt_in.shape == tgt_out.shape and src.shape[0] == tgt_in.shape[0]
    assert (tgt_in[:, 0] == BOS_ID).all()
    # tgt_in[1:] and tgt_out[:-1] carry the same tokens y; tgt_out ends with eos
    for i in range(src.shape[0]):
        n = int(batch["tgt_lengths"][i])
        assert tgt_out[i, n - 1] == EOS_ID and (tgt_out[i, n:] == PAD_ID).all()
        assert torch.equal(tgt_in[i, 1:n], tgt_out[i, : n - 1])
        assert int(batch["src_lengths"][i]) == int((src[i] != PAD_ID).sum())
    assert batch["ntokens"] == int((tgt_out != PAD_ID).sum())
    assert torch.equal(batch["src_padding_mask"], src.eq(PAD_ID))
    # index points at the raw training sentence
    refs = dm.references("train")
    hyp = tok.decode_tgt(tgt_out.tolist())
    assert hyp == [refs[i] for i in batch["index"].tolist()]


def test_second_run_reuses_tokenizer_and_token_cache(dm_kwargs: dict) -> None:
    first = TranslationDataModule(**dm_kwargs)
    first.prepare_data()
    assert "tokenizer_train_s" in first.timings
    cache = Path(dm_kwargs["cache_dir"])
    assert len(list((cache / "tokenizers").iterdir())) == 1
    assert len(list((cache / "cache").iterdir())) == 3  # train, valid, test
    second = TranslationDataModule(**dm_kwargs)
    second.prepare_data()
    second.setup("fit")
    assert "tokenizer_train_s" not in second.timings  # loaded, not trained
    assert second.tokenizer.to_dict() == first.tokenizer.to_dict()
    assert len(list((cache / "cache").iterdir())) == 3


def test_settings_change_the_cache_key(dm_kwargs: dict) -> None:
    a = TranslationDataModule(**dm_kwargs)
    b = TranslationDataModule(**{**dm_kwargs, "tokenizer": {"vocab_size": 50, "model_type": "bpe"}})
    c = TranslationDataModule(**{**dm_kwargs, "src_lang": "de", "tgt_lang": "en"})
    assert len({a.tokenizer_dir(), b.tokenizer_dir(), c.tokenizer_dir()}) == 3
    assert "bpe50" in b.tokenizer_dir().name


def test_separate_vocabularies(dm_kwargs: dict) -> None:
    tok_cfg = {**dm_kwargs["tokenizer"], "joint": False}
    dm = TranslationDataModule(**{**dm_kwargs, "tokenizer": tok_cfg})
    dm.setup("validate")
    assert not dm.tokenizer.joint
    assert (Path(dm.tokenizer_dir()) / "tgt.model").exists()


def test_reverse_direction_needs_no_new_files(dm_kwargs: dict) -> None:
    fwd = TranslationDataModule(**dm_kwargs)
    rev = TranslationDataModule(**{**dm_kwargs, "src_lang": "de", "tgt_lang": "en"})
    assert fwd.references("valid") == rev.sources("valid")
    assert fwd.sources("valid") == rev.references("valid")


def test_train_filters_are_counted_and_eval_is_not_filtered(
    tmp_path: Path, dm_kwargs: dict, caplog: pytest.LogCaptureFixture
) -> None:
    corpus = Path(dm_kwargs["dir"])
    bad_src = ["a b", "", "man woman dog cat " * 30, "a", "red"]
    bad_tgt = ["", "ein", "mann frau hund katze " * 30, "ein der mann frau hund katze rot", "rot"]
    for split in ("train", "valid"):
        for lang, extra in (("en", bad_src), ("de", bad_tgt)):
            f = corpus / f"{split}.{lang}"
            f.write_text(f.read_text(encoding="utf-8") + "\n".join(extra) + "\n", encoding="utf-8")
    kw = {**dm_kwargs, "filter": {"min_len": 1, "max_len": 60, "max_ratio": 3.0}}
    dm = TranslationDataModule(**kw)
    with caplog.at_level(logging.INFO, logger="litmt.data"):
        dm.setup(None)
    c = dm.filter_counts
    assert (c["empty"], c["too_long"], c["bad_ratio"]) == (2, 1, 1)
    assert c["kept"] == c["total"] - 4
    assert f"train filter: kept {c['kept']} of {c['total']} pairs (empty 2" in caplog.text
    # every valid example (including the bad ones) is batched exactly once, in index order
    n_valid = len(dm.references("valid"))
    assert n_valid == 40 + len(bad_src)
    idx = sorted(i for b in dm.val_dataloader() for i in b["index"].tolist())
    assert idx == list(range(n_valid))
    train_idx = sorted(i for b in dm.train_dataloader() for i in b["index"].tolist())
    assert len(train_idx) == c["kept"] and 300 not in train_idx  # line 301 was empty


def test_eval_truncates_to_max_positions(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**{**dm_kwargs, "max_positions": 5, "filter": {"max_len": 4}})
    dm.setup("test")
    for batch in dm.test_dataloader():
        assert batch["src"].shape[1] <= 5 and batch["tgt_out"].shape[1] <= 5


def test_limit_takes_the_first_training_pairs(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**{**dm_kwargs, "limit": 50})
    dm.setup("fit")
    assert len(dm.references("train")) == 50
    assert sum(len(b["index"]) for b in dm.train_dataloader()) <= 50


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_eval_loaders_under_ddp(
    dm_kwargs: dict, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    dm = TranslationDataModule(**{**dm_kwargs, "eval_max_tokens": 60})
    dm.setup("validate")
    gathered, counts = [], []
    for rank in range(world):
        monkeypatch.setattr(
            "litmt.data.batching.sampler.dist_rank_world", lambda r=rank: (r, world)
        )
        batches = list(dm.val_dataloader())
        counts.append(len(batches))
        gathered += [i for b in batches for i in b["index"].tolist()]
    assert len(set(counts)) == 1
    assert sorted(gathered) == list(range(len(dm.references("valid"))))


def test_pin_memory_follows_cuda(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    dm.setup("validate")
    assert dm.val_dataloader().pin_memory == torch.cuda.is_available()
    dm = TranslationDataModule(**{**dm_kwargs, "pin_memory": False})
    dm.setup("validate")
    assert dm.val_dataloader().pin_memory is False


def test_collate_empty_source_becomes_eos() -> None:
    import numpy as np

    batch = collate([(0, np.zeros(0, dtype=np.int32), np.array([7, 8], dtype=np.int32))])
    assert batch["src"].tolist() == [[EOS_ID]]
    assert batch["tgt_in"].tolist() == [[BOS_ID, 7, 8]] and batch["tgt_out"].tolist() == [
        [7, 8, EOS_ID]
    ]


def test_tokenising_with_several_processes_matches_one(
    tmp_path: Path, make_corpus, dm_kwargs: dict
) -> None:
    corpus = make_corpus("big", sizes={"train": 2400, "valid": 10, "test": 10})
    kw = {**dm_kwargs, "dir": str(corpus)}
    one = TranslationDataModule(**{**kw, "cache_dir": str(tmp_path / "c1"), "num_proc": 1})
    two = TranslationDataModule(**{**kw, "cache_dir": str(tmp_path / "c2"), "num_proc": 2})
    one.setup("fit")
    two.setup("fit")
    a, b = one.datasets["train"], two.datasets["train"]
    assert (a.src_values == b.src_values).all() and (a.tgt_offsets == b.tgt_offsets).all()
    assert one.references("train") == two.references("train")


def test_tokenizer_pickles_as_bytes(dm_kwargs: dict) -> None:
    import pickle

    dm = TranslationDataModule(
        **{**dm_kwargs, "tokenizer": {**dm_kwargs["tokenizer"], "joint": False}}
    )
    dm.setup("validate")
    tok = pickle.loads(pickle.dumps(dm.tokenizer))
    refs = dm.references("valid")
    assert tok.to_dict() == dm.tokenizer.to_dict()
    assert tok.encode_tgt(refs) == dm.tokenizer.encode_tgt(refs)


def test_gather_rows_matches_python_slicing() -> None:
    import numpy as np

    from litmt.data.preparation.encoding import gather_rows

    rows = [[1, 2], [], [3], [4, 5, 6], [7]]
    offsets = np.array([0, 2, 2, 3, 6, 7])
    values = np.array([1, 2, 3, 4, 5, 6, 7])
    pos = np.array([3, 1, 0, 4])
    v, o = gather_rows(values, offsets, pos)
    assert [v[o[i] : o[i + 1]].tolist() for i in range(len(pos))] == [rows[p] for p in pos]


def test_filtered_training_batches_carry_their_own_text(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**{**dm_kwargs, "filter": {"max_len": 8}})
    dm.setup("fit")
    assert dm.filter_counts["too_long"] > 0
    refs = dm.references("train")
    for batch in dm.train_dataloader():
        hyp = dm.tokenizer.decode_tgt(batch["tgt_out"].tolist())
        assert hyp == [refs[i] for i in batch["index"].tolist()]
