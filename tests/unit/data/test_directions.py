"""Several directions in one model (`data.directions`): the language tag reaches the model on
the side `data.tag_placement` says, temperature sampling gives the shares it promises on
unequal corpora, and the valid split knows each example's direction."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from temperature_corpus import BIG, temperature_kwargs
from tiny_corpora import write_multi

from litmt.data import TranslationDataModule
from litmt.data.corpora.multi import MultiCorpus
from litmt.data.directions import (
    epoch_subset,
    parse_directions,
    sampled_positions,
    sampling_weights,
)
from litmt.errors import ConfigError


@pytest.fixture
def multi_kwargs(tmp_path: Path, dm_kwargs: dict) -> dict:
    corpus = write_multi(tmp_path / "multi", {"train": 120, "valid": 20, "test": 10})
    return {
        **dm_kwargs,
        "dir": str(corpus),
        "directions": ["en-de", "en-fr"],
        "filter": {"max_ratio": math.inf},
        "max_tokens": 150,
    }


def test_parse_directions() -> None:
    dirs = parse_directions(["en-de", "en_fr", {"pair": "de-cs", "dir": "x"}])
    assert [d.name for d in dirs] == ["en-de", "en-fr", "de-cs"]
    assert [d.tag for d in dirs] == ["<2de>", "<2fr>", "<2cs>"]
    assert dirs[2].dir == "x"
    with pytest.raises(ConfigError, match="two different language codes"):
        parse_directions(["en-en"])
    with pytest.raises(ConfigError, match="twice"):
        parse_directions(["en-de", "en-de"])


@pytest.mark.parametrize("placement", ["source", "target"])
def test_the_tag_reaches_the_model_on_its_side(multi_kwargs: dict, placement: str) -> None:
    dm = TranslationDataModule(**multi_kwargs, tag_placement=placement)
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    de, fr = tok.src_tags["<2de>"], tok.src_tags["<2fr>"]  # user-defined symbols: one id each
    assert tok.src.id_to_piece(fr) == "<2fr>"
    spans = dm.direction_spans("valid")
    assert spans == [("en-de", 0, 20), ("en-fr", 20, 40)]
    valid = dm.datasets["valid"]
    for pos in range(len(valid)):
        index, src, tgt = valid[pos]
        tag = de if index < 20 else fr
        side, other = (src, tgt) if placement == "source" else (tgt, src)
        assert int(side[0]) == tag, (index, side)
        assert tag not in other.tolist()
    # references are the plain target text; decoding drops the language token
    refs = dm.references("valid")
    assert not any(r.startswith("<2") for r in refs)
    assert tok.decode_tgt([[fr, *tok.encode_tgt(["un chien"])[0]]]) == ["un chien"]
    forced = dm.forced_prefixes("valid", [0, 19, 20, 39])
    assert forced == (None if placement == "source" else [[de], [de], [fr], [fr]])
    assert dm.languages_meta() == {"directions": ["en-de", "en-fr"], "tag_placement": placement}


def test_one_pair_is_unchanged(dm_kwargs: dict) -> None:
    dm = TranslationDataModule(**dm_kwargs)
    assert dm.direction_spans("valid") is None and dm.languages_meta() == {}
    assert dm.forced_prefixes("valid", [0]) is None


def test_sampling_weights() -> None:
    assert sampling_weights([300, 100], 1.0) == pytest.approx([0.75, 0.25])
    assert sampling_weights([300, 100], math.inf) == pytest.approx([0.5, 0.5])
    t5 = sampling_weights([300, 100], 5.0)
    assert t5[0] == pytest.approx(3**0.2 / (3**0.2 + 1))
    with pytest.raises(ConfigError, match="sampling_temperature"):
        sampling_weights([1], 0.0)


def test_sampled_positions_repeat_the_small_direction() -> None:
    groups = [np.arange(300), np.arange(300, 400)]
    positions, counts = sampled_positions(groups, math.inf, seed=0)
    assert counts == [200, 200] and len(positions) == 400
    small = positions[positions >= 300]
    assert Counter(Counter(small.tolist()).values()) == {2: 100}  # every pair twice
    big = positions[positions < 300]
    assert len(set(big.tolist())) == 200  # a subset, without repeats


def test_a_downsampled_direction_is_redrawn_and_covered_within_its_cycle() -> None:
    """1000 + 30 pairs at T=inf: en-de keeps 515 a epoch, a new subset each epoch; two
    epochs (ceil(1000 / 515)) see every pair, and the draw depends only on (seed, epoch)."""
    groups = [np.arange(1000), np.arange(1000, 1030)]
    draws = [sampled_positions(groups, math.inf, seed=3, epoch=e)[0] for e in range(4)]
    big = [d[d < 1000] for d in draws]
    assert all(len(b) == 515 and len(set(b.tolist())) == 515 for b in big)  # no pair twice
    assert set(big[0].tolist()) | set(big[1].tolist()) == set(range(1000))  # one cycle
    assert set(big[2].tolist()) | set(big[3].tolist()) == set(range(1000))  # the next
    assert big[0].tolist() != big[2].tolist()  # a new permutation per cycle
    again = sampled_positions(groups, math.inf, seed=3, epoch=1)[0]
    assert again.tolist() == draws[1].tolist()  # pure in (seed, epoch): resume, DDP ranks
    other = sampled_positions(groups, math.inf, seed=4, epoch=1)[0]
    assert other.tolist() != draws[1].tolist()


@pytest.mark.parametrize(("n", "size"), [(10, 3), (7, 7), (9, 1), (5, 0)])
def test_epoch_subset_cycles_through_every_position(n: int, size: int) -> None:
    cycle = -(-n // size) if size else 1
    seen: list[int] = []
    for epoch in range(cycle):
        part = epoch_subset(n, size, seed=0, key=1, epoch=epoch).tolist()
        assert len(part) == len(set(part)) == size
        seen += part
    assert set(seen) == (set(range(n)) if size else set())


def test_three_directions_at_t5_cover_the_large_one_in_five_epochs(
    tmp_path: Path, dm_kwargs: dict
) -> None:
    """en-de (400 pairs) with en-fr and en-cs (40 each) at T=5: en-de gets 212 examples an
    epoch; over 5 epochs of the train loader, epochs selected as Lightning does, the en-de
    pairs seen cover >= 95 % of en-de (all of it, after ceil(400 / 212) = 2 epochs). A
    draw made once per run covered 53 %."""
    dm = TranslationDataModule(**temperature_kwargs(tmp_path / "t5", dm_kwargs))
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    seen: set[int] = set()
    per_epoch = []
    for epoch in range(5):
        loader.batch_sampler.sampler.set_epoch(epoch)  # Lightning's `_set_sampler_epoch`
        de = [i for b in loader for i in b["index"].tolist() if i < BIG]
        assert len(de) == len(set(de)) == 212  # its share, no pair twice in an epoch
        per_epoch.append(sorted(de))
        seen.update(de)
        if epoch == 1:
            assert len(seen) == BIG
    assert len(seen) / BIG >= 0.95
    assert per_epoch[0] != per_epoch[1]


@pytest.mark.parametrize(("temperature", "share"), [(1.0, 0.75), (math.inf, 0.5)])
def test_temperature_sampling_on_unequal_corpora(
    tmp_path: Path, dm_kwargs: dict, temperature: float, share: float
) -> None:
    """en-de has 300 training pairs, en-fr 100 (its own folder): the epoch's en-de share
    is 3/4 at T=1 and 1/2 at T=inf."""
    big = write_multi(tmp_path / "big", {"train": 300, "valid": 10, "test": 10})
    small = write_multi(tmp_path / "small", {"train": 100, "valid": 10, "test": 10})
    dm = TranslationDataModule(
        **{**dm_kwargs, "dir": str(big), "filter": {"max_ratio": math.inf}},
        directions=["en-de", {"pair": "en-fr", "dir": str(small)}],
        sampling_temperature=temperature,
    )
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    seen = [i for batch in loader for i in batch["index"].tolist()]
    assert len(seen) == 400
    de_share = sum(i < 300 for i in seen) / len(seen)
    assert de_share == pytest.approx(share, abs=0.01)


@pytest.mark.parametrize("placement", ["source", "target"])
def test_an_extra_source_extends_the_direction_it_names(
    tmp_path: Path, multi_kwargs: dict, placement: str
) -> None:
    """A tagged back-translation corpus (en-fr files) with direction=en-fr: its pairs follow
    en-fr's own in the training split, read from its .fr files, carry its <BT> on the source
    side and en-fr's language token on the placement's side, and count in en-fr's share
    under temperature sampling."""
    bt = write_multi(tmp_path / "bt", {"train": 60})
    dm = TranslationDataModule(
        **multi_kwargs,
        tag_placement=placement,
        extra_train=[{"name": "bt", "dir": str(bt), "tag": "<BT>", "direction": "en_fr"}],
        sampling_temperature=math.inf,  # equal shares: en-de 120, en-fr 120 + 60
    )
    dm.prepare_data()
    dm.setup("fit")
    assert [s.direction for s in dm.extra_train] == [1]
    assert isinstance(dm.corpora, MultiCorpus) and dm.corpora.offsets("train") == [0, 120, 300]
    tok = dm.tokenizer
    fr, bt_id = tok.src_tags["<2fr>"], tok.src_tags["<BT>"]
    french = tok.encode_tgt(bt.joinpath("train.fr").read_text("utf-8").splitlines())
    train = dm.datasets["train"]
    extra = 0
    for pos in range(len(train)):
        index, src, tgt = (x.tolist() if hasattr(x, "tolist") else x for x in train[pos])
        if index < 240:
            assert bt_id not in src, index
            continue
        extra += 1
        if placement == "source":
            assert src[:2] == [fr, bt_id] and tgt == french[index - 240], index
        else:
            assert src[0] == bt_id and tgt == [fr, *french[index - 240]], index
    assert extra >= 40  # of 60 (the filters drop a few)
    seen = [i for batch in dm.train_dataloader() for i in batch["index"].tolist()]
    assert sum(i >= 120 for i in seen) / len(seen) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize(
    ("directions", "direction", "message"),
    [
        (["en-de", "en-fr"], None, r"^data\.extra_train\[0\] needs direction=SRC-TGT with "
         r"data\.directions, one of en-de, en-fr$"),
        (["en-de", "en-fr"], "en-cs", r"^data\.extra_train\[0\]\.direction=en-cs is not one of "
         r"data\.directions: en-de, en-fr$"),
        (None, "en-fr", r"^data\.extra_train\[0\]\.direction=en-fr is not one of the pair this "
         r"model trains: en-de$"),
    ],
)  # fmt: skip
def test_an_extra_source_without_a_known_direction_is_refused(
    multi_kwargs: dict, directions: list[str] | None, direction: str | None, message: str
) -> None:
    entry = {"dir": multi_kwargs["dir"], **({} if direction is None else {"direction": direction})}
    kwargs = {**multi_kwargs, "directions": directions, "extra_train": [entry]}
    with pytest.raises(ConfigError, match=message):
        TranslationDataModule(**kwargs)
