"""Several training sources: concatenated and all seen once per epoch, the `<BT>` tag is one
piece of the tokenizer, and an existing sentencepiece model is reused byte for byte."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pytest
from tiny_corpora import make_pairs, write_text_corpus

from litmt.data import TranslationDataModule
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.sources import TrainSource, split_fingerprint
from litmt.data.tokenization.tokenizer import UNK_ID, Tokenizer, TokenizerConfig
from litmt.errors import ConfigError, DataError

SIZES = {"main": 120, "extra": 50, "bt": 40}


def _write_train(root: Path, n: int, seed: int) -> Path:
    """`{root}/train.{en,de}` of `n` synthetic pairs."""
    src, tgt = make_pairs(n, seed=seed, max_words=8)
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (root / "train.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def mixed_kwargs(tmp_path: Path, dm_kwargs: dict) -> dict:
    """A data module over the main corpus plus an untagged and a `<BT>`-tagged source."""
    main = write_text_corpus(tmp_path / "main", {"train": SIZES["main"], "valid": 20, "test": 20})
    extra = _write_train(tmp_path / "extra", SIZES["extra"], seed=5)
    bt = _write_train(tmp_path / "bt", SIZES["bt"], seed=6)
    return {
        **dm_kwargs,
        "dir": str(main),
        "extra_train": [
            {"name": "extra", "dir": str(extra)},
            {"name": "bt", "dir": str(bt), "tag": "<BT>"},
        ],
        "filter": {"max_ratio": math.inf},  # keep every pair, so every one must be seen
        "max_tokens": 120,
    }


def test_every_source_is_seen_once_per_epoch(mixed_kwargs: dict) -> None:
    dm = TranslationDataModule(**mixed_kwargs)
    dm.prepare_data()
    dm.setup("fit")
    total = sum(SIZES.values())
    assert dm.filter_counts["kept"] == dm.filter_counts["total"] == total
    bounds = {"main": 0, "extra": SIZES["main"], "bt": SIZES["main"] + SIZES["extra"]}

    def source_of(i: int) -> str:
        return max((b, name) for name, b in bounds.items() if b <= i)[1]

    for epoch in range(2):
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        seen = [i for batch in loader for i in batch["index"].tolist()]
        assert sorted(seen) == list(range(total))  # each pair exactly once
        assert Counter(source_of(i) for i in seen) == SIZES
    # the order is shuffled across sources, not one source after the other
    first = [source_of(i) for i in seen[: total // 3]]
    assert len(set(first)) == 3


def test_the_bt_tag_is_one_piece_on_the_source_side(mixed_kwargs: dict) -> None:
    dm = TranslationDataModule(**mixed_kwargs)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    assert "<BT>" in tok.src_tags  # a user-defined symbol of the trained sentencepiece model
    bt = tok.src_tags["<BT>"]
    assert tok.src.id_to_piece(bt) == "<BT>"
    assert tok.encode_src(["<BT> a red dog"])[0] == [bt, *tok.encode_src(["a red dog"])[0]]
    sources, targets = dm.sources("train"), dm.references("train")
    start = SIZES["main"] + SIZES["extra"]
    bt_src, bt_tgt = make_pairs(SIZES["bt"], seed=6, max_words=8)
    assert sources[start:] == [f"<BT> {s}" for s in bt_src]  # tagged on the source side only
    assert targets[start:] == bt_tgt
    assert not any(s.startswith("<BT>") for s in sources[:start])
    ds = dm.datasets["train"]
    for i in range(len(sources)):
        ids = ds.src_values[ds.src_offsets[i] : ds.src_offsets[i + 1]].tolist()
        assert (ids[0] == bt) == (i >= start) and ids.count(bt) == (i >= start)


def test_extra_sources_and_tags_change_the_cache_keys(tmp_path: Path) -> None:
    main = ParallelCorpus(
        "en", "de", dir=write_text_corpus(tmp_path / "m", {"train": 20, "valid": 5})
    )
    extra = ParallelCorpus("en", "de", dir=_write_train(tmp_path / "x", 10, seed=3))
    keys = {
        split_fingerprint(main, [], "train"),
        split_fingerprint(main, [TrainSource(extra)], "train"),
        split_fingerprint(main, [TrainSource(extra, tag="<BT>")], "train"),
    }
    assert len(keys) == 3
    assert split_fingerprint(main, [TrainSource(extra)], "valid") == main.fingerprint("valid")


def test_extra_train_from_the_command_line(tmp_path: Path, text_corpus: Path) -> None:
    import hydra
    from train_utils import compose_train

    bt = _write_train(tmp_path / "bt", 10, seed=2)
    cfg = compose_train(
        [
            "data=local",
            f"data.dir={text_corpus}",
            f"data.cache_dir={tmp_path / 'cache'}",
            f'data.extra_train=[{{name: bt, dir: "{bt}", tag: "<BT>"}}]',
        ],
        tmp_path,
    )
    dm = hydra.utils.instantiate(cfg.data)
    assert [(s.name, s.tag, Path(s.corpus.dir)) for s in dm.extra_train] == [("bt", "<BT>", bt)]
    assert dm.tokenizer_settings.user_defined_symbols == ["<BT>"]


def test_bad_extra_sources_are_one_line_errors(dm_kwargs: dict, tmp_path: Path) -> None:
    cases = [
        (
            [{"dir": str(tmp_path), "tags": "<BT>"}],
            "unknown data.extra_train[0] keys ['tags'] (did you mean tags -> tag?)",
        ),
        ([{"tag": "<BT>"}], "needs dir=PATH or hub.path"),
        (
            [{"hub": {"path": "x", "splits": {}}}],
            "unknown data.extra_train[0].hub keys ['splits']",
        ),
        ([{"dir": str(tmp_path), "tag": "<B T>"}], "must be one word"),
        (["path"], "must be a mapping"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            TranslationDataModule(**{**dm_kwargs, "extra_train": extra})
    dm = TranslationDataModule(**{**dm_kwargs, "extra_train": [{"dir": str(tmp_path)}]})
    with pytest.raises(DataError, match="missing file"):
        dm.prepare_data()


def test_an_existing_sentencepiece_model_is_reused_byte_for_byte(
    dm_kwargs: dict, tmp_path: Path
) -> None:
    src, tgt = make_pairs(200, seed=9)
    given = Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=50))
    path = tmp_path / "given.model"
    path.write_bytes(given.src_model_bytes)
    tokenizer = {"vocab_size": 999, "model": str(path)}  # training settings are then ignored
    dm = TranslationDataModule(**{**dm_kwargs, "tokenizer": tokenizer})
    dm.prepare_data()
    dm.setup("fit")
    assert dm.tokenizer.src_model_bytes == path.read_bytes() and dm.tokenizer.joint
    assert "tokenizer_train_s" not in dm.timings  # nothing was trained
    assert dm.tokenizer_dir().name.split("-")[3] == "given"
    with pytest.raises(DataError, match="does not exist"):
        TranslationDataModule(**{**dm_kwargs, "tokenizer": {"model": str(tmp_path / "nope")}})
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a sentencepiece model"):
        TranslationDataModule(**{**dm_kwargs, "tokenizer": {"model": str(tmp_path / "junk.model")}})


def test_a_tag_the_given_tokenizer_lacks_is_a_one_line_error(
    mixed_kwargs: dict, tmp_path: Path
) -> None:
    src, tgt = make_pairs(200, seed=9)
    path = tmp_path / "plain.model"
    path.write_bytes(Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=50)).src_model_bytes)
    with pytest.raises(
        ConfigError, match=r"<BT> of data\.extra_train is not a user-defined symbol"
    ):
        TranslationDataModule(**{**mixed_kwargs, "tokenizer": {"model": str(path)}})


def test_the_tokenizer_learns_from_every_training_source(tmp_path: Path, dm_kwargs: dict) -> None:
    """A letter found only in an extra source is in the tokenizer's alphabet (not <unk>): the
    student's tokenizer, for one, sees the references mixed into its distilled corpus."""
    main = write_text_corpus(tmp_path / "main", {"train": SIZES["main"], "valid": 20, "test": 20})
    assert "ž" not in (main / "train.en").read_text(encoding="utf-8")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "train.en").write_text("žaba skače\n" * 40, encoding="utf-8")
    (extra / "train.de").write_text("der Frosch springt\n" * 40, encoding="utf-8")
    dm = TranslationDataModule(
        **{**dm_kwargs, "dir": str(main), "extra_train": [{"name": "extra", "dir": str(extra)}]}
    )
    dm.prepare_data()
    dm.setup("fit")
    (ids,) = dm.tokenizer.encode_src(["žaba"])
    assert UNK_ID not in ids
