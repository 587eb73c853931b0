"""Subword regularisation (`data.tokenizer.sampling_alpha`): off, the training batches are the
cached ones; on, only the training items get a sampled segmentation of the same text, with
their tags and bos/eos in place, reproducible per (seed, epoch), and a model still learns."""

from __future__ import annotations

import itertools
import json
import math
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F
from temperature_corpus import temperature_kwargs
from tiny_corpora import make_pairs, write_multi

from litmt.data import TranslationDataModule
from litmt.data.batching.collate import TokenizedPairs
from litmt.data.preparation.memmap import TextPairs
from litmt.data.preparation.subword_sampling import SampledPairs
from litmt.data.tokenization.piece_vocab import SPECIAL_PIECES
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerConfig
from litmt.errors import ConfigError, DataError
from litmt.models import Seq2SeqTransformer, TransformerConfig

STEPS = 150  # optimizer steps of the learning test (about 2 s)


def _module(dm_kwargs: dict, **tokenizer: object) -> TranslationDataModule:
    """A prepared data module, `tokenizer` added to the fixture's tokenizer settings."""
    dm = TranslationDataModule(
        **{**dm_kwargs, "tokenizer": {**dm_kwargs["tokenizer"], **tokenizer}}
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _batches(dm: TranslationDataModule, epoch: int, split: str = "train") -> list[dict]:
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    loader.set_epoch(epoch)
    return list(loader)


def _same_batches(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys() or x["ntokens"] != y["ntokens"]:
            return False
        if not all(torch.equal(x[k], y[k]) for k in x if k != "ntokens"):
            return False
    return True


def _by_index(batches: list[dict]) -> dict[int, tuple[list[int], list[int]]]:
    """Example index -> (source ids, target ids) of the batches (no repeats)."""
    out = {}
    for b in batches:
        for row, index in enumerate(b["index"].tolist()):
            m, n = int(b["src_lengths"][row]), int(b["tgt_lengths"][row])
            out[index] = (b["src"][row, :m].tolist(), b["tgt_out"][row, : n - 1].tolist())
    return out


def _items(ds: TokenizedPairs) -> list[tuple[int, list[int], list[int]]]:
    return [(i, s.tolist(), t.tolist()) for i, s, t in (ds[p] for p in range(len(ds)))]


# -- off: today's batches -------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [None, 0.0])
def test_off_the_training_batches_are_the_cached_ones(dm_kwargs: dict, alpha: float | None) -> None:
    plain = _module(dm_kwargs)
    off = _module(dm_kwargs, sampling_alpha=alpha, sampling_nbest=5)
    assert type(off.datasets["train"]) is TokenizedPairs  # the cached ids, no re-encoding
    for epoch in (0, 1):
        assert _same_batches(_batches(plain, epoch), _batches(off, epoch))
    # no raw-text cache: only train, valid and test token ids
    assert len(list((Path(dm_kwargs["cache_dir"]) / "cache").iterdir())) == 3


def test_sampling_changes_no_cache_key(dm_kwargs: dict) -> None:
    plain = _module(dm_kwargs)
    on = _module(dm_kwargs, sampling_alpha=0.3, sampling_nbest=8)
    assert on.tokenizer_settings.key() == plain.tokenizer_settings.key()
    assert on.tokenizer_dir() == plain.tokenizer_dir()
    for split in ("train", "valid", "test"):
        assert on._cache_path(split, on.tokenizer) == plain._cache_path(split, plain.tokenizer)


def test_the_best_segmentation_re_encoded_equals_the_cache(dm_kwargs: dict) -> None:
    """nbest=1 runs the on-the-fly path with the best segmentation: item for item and batch
    for batch what preparation stored."""
    plain = _module(dm_kwargs)
    best = _module(dm_kwargs, sampling_alpha=0.5, sampling_nbest=1)
    assert isinstance(best.datasets["train"], SampledPairs)
    assert _items(best.datasets["train"]) == _items(plain.datasets["train"])
    assert _same_batches(_batches(plain, 1), _batches(best, 1))


# -- on: the training split only --------------------------------------------------------------
@pytest.mark.parametrize(("model_type", "alpha"), [("unigram", 0.1), ("bpe", 0.2)])
def test_sampled_items_keep_their_text_and_only_train_is_sampled(
    dm_kwargs: dict, model_type: str, alpha: float
) -> None:
    plain = _module(dm_kwargs, model_type=model_type)
    dm = _module(dm_kwargs, model_type=model_type, sampling_alpha=alpha)
    tok = dm.tokenizer
    assert tok.to_dict() == plain.tokenizer.to_dict()
    sources, refs = dm.sources("train"), dm.references("train")
    cached = {i: (s, t) for i, s, t in _items(plain.datasets["train"])}
    changed = set()
    for epoch in (0, 1):
        seen = []
        for batch in _batches(dm, epoch):
            tgt_in, tgt_out = batch["tgt_in"], batch["tgt_out"]
            assert (tgt_in[:, 0] == BOS_ID).all()
            for row, index in enumerate(batch["index"].tolist()):
                n, m = int(batch["tgt_lengths"][row]), int(batch["src_lengths"][row])
                src, tgt = batch["src"][row, :m].tolist(), tgt_out[row, : n - 1].tolist()
                assert tgt_out[row, n - 1] == EOS_ID and tgt_in[row, 1:n].tolist() == tgt
                assert not {BOS_ID, EOS_ID, PAD_ID} & set(src + tgt)
                assert tok.src.decode(src) == sources[index]
                assert tok.decode_tgt([tgt]) == [refs[index]]
                for side, ids in enumerate((src, tgt)):
                    if ids != cached[index][side]:
                        changed.add((epoch, side, index))
                seen.append(index)
        assert sorted(seen) == sorted(cached)  # every pair once per epoch
    # both sides are sampled, every epoch, and differently in each
    groups = [
        {i for e, s, i in changed if (e, s) == key} for key in [(0, 0), (0, 1), (1, 0), (1, 1)]
    ]
    assert all(len(g) > len(cached) // 4 for g in groups), [len(g) for g in groups]
    assert groups[0] != groups[2] and groups[1] != groups[3]
    # valid and test: the cached best segmentation, batch for batch
    for split in ("valid", "test"):
        dm.setup("test" if split == "test" else "validate")
        assert type(dm.datasets[split]) is TokenizedPairs
        plain._dataset(split)
        assert _items(dm.datasets[split]) == _items(plain.datasets[split])
    assert _same_batches(_batches(plain, 0, "valid"), _batches(dm, 0, "valid"))


@pytest.mark.parametrize("placement", ["source", "target"])
def test_sampled_items_keep_the_language_tag_on_its_side(
    tmp_path: Path, dm_kwargs: dict, placement: str
) -> None:
    """en-de has 120 training pairs, en-fr 40 (its own folder), resampled at T=inf: en-fr
    examples repeat, so dataset positions are not example indices."""
    big = write_multi(tmp_path / "big", {"train": 120, "valid": 20, "test": 10})
    small = write_multi(tmp_path / "small", {"train": 40, "valid": 10, "test": 10})
    kwargs = {
        **dm_kwargs,
        "dir": str(big),
        "directions": ["en-de", {"pair": "en-fr", "dir": str(small)}],
        "tag_placement": placement,
        "sampling_temperature": math.inf,
        "filter": {"max_ratio": float("inf")},
    }
    plain = _module(kwargs)
    dm = _module(kwargs, sampling_alpha=0.1)
    tok = dm.tokenizer
    train = dm.datasets["train"]
    assert isinstance(train, SampledPairs) and len(train) == len(plain.datasets["train"])
    assert len(set(train.indices.tolist())) < len(train)  # repeats
    tags = {tok.src_tags["<2de>"], tok.src_tags["<2fr>"]}
    sources, refs = dm.sources("train"), dm.references("train")
    differ = 0
    for pos in range(len(train)):
        index, src, tgt = train[pos]
        _, src0, tgt0 = plain.datasets["train"][pos]
        tag = tok.src_tags["<2de>" if index < 120 else "<2fr>"]
        side, other = (src, tgt) if placement == "source" else (tgt, src)
        assert int(side[0]) == tag and not tags & set(side[1:].tolist() + other.tolist())
        text = sources[index].partition(" ")[2] if placement == "source" else sources[index]
        assert tok.src.decode(src.tolist()[placement == "source" :]) == text
        assert tok.decode_tgt([tgt.tolist()]) == [refs[index]]
        differ += not (np.array_equal(src, src0) and np.array_equal(tgt, tgt0))
    # toy sentences of 1-6 words: a sampled side often exceeds its planned length in every
    # draw and keeps its best segmentation, so fewer items differ than on real text (19 to
    # 36 of 160 across processes: sampling_nbest=-1 draws with sentencepiece's generator, whose
    # samples differ between processes for the same seed, litmt.data.tokenization.segmentation); without
    # sampling none would
    assert differ > len(train) // 20


def test_sampled_items_follow_each_epochs_temperature_draw(tmp_path: Path, dm_kwargs: dict) -> None:
    """Three directions at T=5 with subword sampling: each epoch serves that epoch's draw of
    examples (`SampledPairs.set_epoch` passes the epoch on to the resampled pairs, whose
    lengths the epoch's batches are planned on)."""
    dm = _module(temperature_kwargs(tmp_path / "t5", dm_kwargs), sampling_alpha=0.1)
    train = dm.datasets["train"]
    assert isinstance(train, SampledPairs) and train.redrawn_per_epoch
    served = []
    for epoch in (0, 1):
        seen = Counter(i for b in _batches(dm, epoch) for i in b["index"].tolist())
        assert seen == Counter(train.pairs.at_epoch(epoch).indices.tolist())
        served.append(seen)
    assert served[0] != served[1]


def test_sampled_items_keep_the_tag_of_an_extra_source(tmp_path: Path, dm_kwargs: dict) -> None:
    bt = tmp_path / "bt"
    bt.mkdir()
    src, tgt = make_pairs(40, seed=6, max_words=8)
    (bt / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (bt / "train.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    kwargs = {**dm_kwargs, "extra_train": [{"name": "bt", "dir": str(bt), "tag": "<BT>"}]}
    dm = _module(kwargs, sampling_alpha=0.1)
    tok, train = dm.tokenizer, dm.datasets["train"]
    main = len(dm.references("train")) - 40
    tagged = [train[p] for p in range(len(train)) if train[p][0] >= main]
    assert tagged and all(int(s[0]) == tok.src_tags["<BT>"] for _, s, _ in tagged)
    assert all(int(s[0]) != tok.src_tags["<BT>"] for i, s, _ in map(train.__getitem__,
               range(len(train))) if i < main)  # fmt: skip


def test_a_piece_vocabulary_tokenizer_samples_too() -> None:
    """An imported (Marian) tokenizer: ids from its piece list, the source eos and a leading
    ``>>fr<<`` kept, the text unchanged."""
    src, tgt = make_pairs(200, seed=3)
    proc = Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=60)).src_model_bytes
    plain = Tokenizer(proc)
    pieces = [*SPECIAL_PIECES, *(plain.src.id_to_piece(i) for i in range(4, plain.src_vocab_size))]
    tok = Tokenizer(proc, vocab=[*pieces, ">>fr<<"], src_eos=True)
    sampling = TokenizerConfig(sampling_alpha=0.1).sampling()
    texts = [f">>fr<< {s}" for s in src[:50]]
    best = tok.encode_src(texts)
    spm.set_random_generator_seed(5)
    sampled = tok.encode_src(texts, sampling)
    spm.set_random_generator_seed(5)
    assert tok.encode_src(texts, sampling) == sampled
    assert sum(a != b for a, b in zip(best, sampled, strict=True)) > 10
    fr = len(pieces)
    assert all(ids[0] == fr and ids[-1] == EOS_ID for ids in sampled)
    assert tok.decode_tgt([ids[1:] for ids in sampled]) == src[:50]


def test_the_raw_text_cache_pickles_as_its_path_and_refuses_truncation(dm_kwargs: dict) -> None:
    dm = _module(dm_kwargs, sampling_alpha=0.1)
    texts = dm.datasets["train"].texts
    assert len(texts) == 300 and texts[7] == (dm.sources("train")[7], dm.references("train")[7])
    blob = pickle.dumps(texts)
    assert len(blob) < 500 and pickle.loads(blob)[7] == texts[7]  # workers map the files
    data = texts.path / "tgt.txt"
    data.write_bytes(data.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"^the text cache .* is corrupt \(tgt\.txt has \d+ bytes, "
                       r"expected \d+\); delete that directory and run again to rebuild it$"):  # fmt: skip
        TextPairs(texts.path)


# -- reproducible per (seed, epoch) -----------------------------------------------------------
def test_same_seed_and_epoch_same_segmentations(dm_kwargs: dict) -> None:
    a = _module(dm_kwargs, sampling_alpha=0.1)
    b = _module(dm_kwargs, sampling_alpha=0.1)
    assert _same_batches(_batches(a, 0), _batches(b, 0))
    assert _same_batches(_batches(a, 3), _batches(b, 3))
    # the loader's epoch reaches the items: another epoch, other segmentations
    one, two = _by_index(_batches(a, 0)), _by_index(_batches(a, 1))
    assert one.keys() == two.keys()
    assert sum(one[i] != two[i] for i in one) > len(one) // 4
    # an item depends on (seed, epoch, position), not on the batch it is in
    train = a.datasets["train"]
    train.set_epoch(1)
    one = _items(train)
    train.set_epoch(2)
    assert _items(train) != one
    train.set_epoch(1)
    backwards = [train[p] for p in reversed(range(len(train)))]
    assert [(i, s.tolist(), t.tolist()) for i, s, t in reversed(backwards)] == one
    other = _module({**dm_kwargs, "seed": 7}, sampling_alpha=0.1).datasets["train"]
    other.set_epoch(1)
    assert _items(other) != one


_CHILD = """
import json, sys
from litmt.data import TranslationDataModule
dm = TranslationDataModule(**json.loads(sys.argv[1]))
dm.prepare_data()
dm.setup("fit")
train = dm.datasets["train"]
train.set_epoch(int(sys.argv[2]))
print(json.dumps([(int(i), s.tolist(), t.tolist()) for i, s, t in map(train.__getitem__, range(len(train)))]))
"""


@pytest.mark.slow
def test_a_rerun_or_another_rank_samples_the_same_nbest_segmentations(dm_kwargs: dict) -> None:
    """`sampling_nbest > 1`: a new process (a rerun, a resume, another DDP rank) builds the
    data module again and gets this process's segmentations, item for item."""
    dm = _module(dm_kwargs, sampling_alpha=0.1, sampling_nbest=8)
    train = dm.datasets["train"]
    train.set_epoch(2)
    here = [[i, s, t] for i, s, t in _items(train)]
    kwargs = {**dm_kwargs, "tokenizer": {**dm_kwargs["tokenizer"], "sampling_alpha": 0.1,
                                         "sampling_nbest": 8}}  # fmt: skip
    run = [sys.executable, "-c", _CHILD, json.dumps(kwargs), "2"]
    children = [json.loads(subprocess.run(run, capture_output=True, text=True, check=True,
                                          timeout=300).stdout) for _ in range(2)]  # fmt: skip
    assert children[0] == here and children[1] == here
    cached = _items(_module(dm_kwargs).datasets["train"])
    assert sum(a != [i, s, t] for a, (i, s, t) in zip(here, cached, strict=True)) > len(here) // 20


def test_workers_sample_what_the_main_process_samples(dm_kwargs: dict) -> None:
    """The epoch reaches the DataLoader worker: the same batches as without workers."""
    main = _module(dm_kwargs, sampling_alpha=0.1)
    worker = _module({**dm_kwargs, "num_workers": 1}, sampling_alpha=0.1)
    loader = worker.train_dataloader()
    assert loader.num_workers == 1 and not loader.persistent_workers
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert _same_batches(_batches(main, epoch), list(loader))


# -- configuration errors ---------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [-0.1, 1.5, math.nan, "0.1", True])
def test_a_bad_alpha_is_a_config_error(alpha: object) -> None:
    with pytest.raises(ConfigError) as err:
        TokenizerConfig(sampling_alpha=alpha)  # type: ignore[arg-type]
    assert str(err.value) == (
        f"data.tokenizer.sampling_alpha={alpha!r} is out of range; use a number in (0, 1] "
        f"(unigram: smoothing, bpe: dropout probability), or null or 0 for no sampling"
    )


@pytest.mark.parametrize("nbest", [0, -2, 2.5])
def test_a_bad_nbest_is_a_config_error(nbest: object) -> None:
    with pytest.raises(ConfigError) as err:
        TokenizerConfig(sampling_alpha=0.1, sampling_nbest=nbest)  # type: ignore[arg-type]
    assert str(err.value) == (
        f"data.tokenizer.sampling_nbest={nbest!r} is out of range; use -1 (sample among all "
        f"segmentations) or an integer >= 1 (among the n best; 1 = the best only)"
    )


def test_alpha_bounds_and_off() -> None:
    assert TokenizerConfig(sampling_alpha=1).sampling() is not None
    assert TokenizerConfig(sampling_alpha=0).sampling() is None
    assert TokenizerConfig().sampling() is None


def test_nbest_with_a_bpe_model_is_a_config_error(dm_kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=r"^data\.tokenizer\.sampling_nbest=4 applies to "
                       r"unigram models only .* leave sampling_nbest at -1 with a bpe model$"):  # fmt: skip
        _module(dm_kwargs, model_type="bpe", sampling_alpha=0.1, sampling_nbest=4)


# -- learning ---------------------------------------------------------------------------------
def test_a_tiny_model_learns_from_sampled_segmentations(dm_kwargs: dict) -> None:
    dm = _module({**dm_kwargs, "max_tokens": 400}, sampling_alpha=0.2)
    tok = dm.tokenizer
    assert isinstance(dm.datasets["train"], SampledPairs)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=32,
        n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
        max_positions=400,
    )  # fmt: skip
    model = Seq2SeqTransformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    epochs = (batch for epoch in itertools.count() for batch in _batches(dm, epoch))
    losses: list[float] = []
    for batch in itertools.islice(epochs, STEPS):  # a new segmentation every epoch
        logits = model(batch["src"], batch["tgt_in"])  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    start, end = np.mean(losses[:5]), np.mean(losses[-5:])
    assert end < 0.5 * start, f"loss {start:.2f} -> {end:.2f}"


# -- batch planning ---------------------------------------------------------------------------
def test_batches_are_planned_on_the_sampled_length_ratio(dm_kwargs: dict) -> None:
    """Setup measures how much longer sampled items are and plans batches on the stored
    lengths x that ratio (capped at filter.max_len): more, smaller batches. Every sampled
    side fits its planned length, so no batch's padded size exceeds the budget, while first
    draws alone (what the loader gave before) would exceed it."""
    budget = 300
    dm = _module({**dm_kwargs, "max_tokens": budget}, sampling_alpha=0.1)
    sampled = dm.datasets["train"]
    ratio = sampled.plan_ratio
    assert ratio == pytest.approx(sampled.length_ratio()[0]) and ratio > 1.05
    stored = sampled.pairs.src_lengths()
    expected = np.minimum(np.ceil(stored * ratio), sampled.max_len)
    assert sampled.src_lengths().tolist() == expected.astype(int).tolist()
    tgt = sampled.pairs.tgt_lengths() - 1
    expected_tgt = np.minimum(np.ceil(tgt * ratio), sampled.max_len) + 1
    assert sampled.tgt_lengths().tolist() == expected_tgt.astype(int).tolist()

    def cost(b: dict) -> int:
        return b["src"].shape[0] * max(b["src"].shape[1], b["tgt_in"].shape[1])

    def epochs(plan_ratio: float) -> list[dict]:
        sampled.plan_ratio = plan_ratio
        return [b for epoch in (0, 1) for b in _batches(dm, epoch)]

    planned = epochs(ratio)
    assert max(cost(b) for b in planned) <= budget
    by_index = _by_index(planned[: len(planned) // 2])  # epoch 0
    cached = {i: (s, t) for i, s, t in _items(sampled.pairs)}
    changed = sum(by_index[i] != cached[i] for i in by_index) / len(by_index)
    assert changed > 0.5, f"only {changed:.0%} of the items were sampled"
    stored_n = len(epochs(1.0))
    assert len(planned) > stored_n
    # the first draws, unplanned, in the batches planned on the stored lengths: over budget
    sampled.plan_ratio = 1.0
    order = [b["index"].tolist() for b in _batches(dm, 0)]
    pos_of = {int(i): p for p, i in enumerate(sampled.indices.tolist())}
    first = [
        len(rows) * max(max(len(x[1]), len(x[2]) + 1) for x in rows)
        for rows in ([sampled.first_draw(pos_of[i]) for i in b] for b in order)
    ]
    assert max(first) > budget


def test_a_side_with_no_draw_that_fits_keeps_its_best_segmentation(dm_kwargs: dict) -> None:
    """planned_len is the planned length of one side; at ratio 1 (planned on the stored
    lengths) a side longer after DRAWS draws falls back to its cached ids, and the rate is
    counted; at the measured ratio fewer sides fall back."""
    dm = _module(dm_kwargs, sampling_alpha=0.1)
    sampled = dm.datasets["train"]
    ratio = sampled.plan_ratio
    assert sampled.planned_len(10) == min(math.ceil(10 * ratio), sampled.max_len)
    at_ratio = sampled.fallback_rate()
    sampled.plan_ratio = 1.0
    assert sampled.planned_len(10) == 10
    at_one = sampled.fallback_rate()
    assert at_ratio < at_one and at_one > 0.1
    for pos in range(len(sampled)):
        _, s, t = sampled[pos]
        _, cs, ct = sampled.pairs[pos]
        assert len(s) <= len(cs) and len(t) <= len(ct)
