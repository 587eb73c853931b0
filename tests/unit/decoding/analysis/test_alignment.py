"""Word alignments from cross-attention (Pharaoh format), pieces merged to words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from tiny_checkpoint import tiny_checkpoint_path
from tiny_model import tiny_config

from litmt.cli.translate import translate
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.analysis.alignment import (
    AlignConfig,
    align_ids,
    hard_alignment,
    pharaoh,
    word_index,
)
from litmt.decoding.config import DecodeConfig
from litmt.decoding.search.dispatch import decode
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

CONF = Path(__file__).resolve().parents[4] / "conf"
VOCAB = 24  # ids 4..23 are "words"


def copy_batch(gen: torch.Generator, n: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """n sequences of 4-8 distinct tokens; (ids, src (n, S), tgt (n, T) = bos + ids + eos)."""
    seqs = []
    for _ in range(n):
        length = int(torch.randint(4, 9, (1,), generator=gen))
        seqs.append((torch.randperm(VOCAB - 4, generator=gen)[:length] + 4).tolist())
    src = torch.full((n, 8), PAD_ID)
    tgt = torch.full((n, 10), PAD_ID)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s)
        tgt[i, : len(s) + 2] = torch.tensor([BOS_ID, *s, EOS_ID])
    return seqs, src, tgt


@pytest.fixture(scope="module")
def copy_model() -> Seq2SeqTransformer:
    """A one-decoder-layer model trained to copy: its only cross-attention must find x_j."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        tiny_config(src_vocab_size=VOCAB, n_encoder_layers=1, n_decoder_layers=1, max_positions=16)
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        _, src, tgt = copy_batch(gen, 64)
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_copy_task_alignments_are_the_diagonal(copy_model):
    seqs, src, _ = copy_batch(torch.Generator().manual_seed(1), 32)
    found = decode(copy_model, src, DecodeConfig(method="greedy"))
    assert sum(h[0].tokens == s for h, s in zip(found, seqs, strict=True)) >= 30  # it copies
    pieces = [[f"\u2581w{t}" for t in s] for s in seqs]  # every piece a word
    links = align_ids([copy_model], seqs, seqs, pieces, pieces)
    for s, link in zip(seqs, links, strict=True):
        assert link == [(i, i) for i in range(len(s))]
    # pieces merged to words: "▁a b ▁c d" = two words on both sides
    merged = [["\u2581a", "b", "\u2581c", "d"]]
    seq = [seqs[0][:4]]
    assert align_ids([copy_model], seq, seq, merged, merged) == [[(0, 0), (1, 1)]]


def test_layer_and_heads_are_configurable(copy_model):
    seqs, _, _ = copy_batch(torch.Generator().manual_seed(2), 4)
    pieces = [[f"\u2581w{t}" for t in s] for s in seqs]
    one_head = align_ids([copy_model], seqs, seqs, pieces, pieces, AlignConfig(heads=(0,)))
    assert all(len(link) == len(s) for link, s in zip(one_head, seqs, strict=True))
    with pytest.raises(ConfigError, match="alignment layer 1 does not exist"):
        align_ids([copy_model], seqs, seqs, pieces, pieces, AlignConfig(layer=1))
    with pytest.raises(ConfigError, match="alignment heads"):
        align_ids([copy_model], seqs, seqs, pieces, pieces, AlignConfig(heads=(9,)))


def test_word_index_and_hard_alignment_by_hand():
    assert word_index(["\u2581A", "\u2581dog", "s", "\u2581run", "."]) == [0, 1, 1, 2, 2]
    assert word_index(["<BT>", "\u2581A", "\u2581dog"], tags=["<BT>"]) == [0, 1, 2]
    assert word_index(["<BT>", "A"], tags=["<BT>"]) == [0, 1]
    weights = torch.tensor(
        [[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]
    )  # 3 target pieces + the eos row (ignored), 3 source pieces
    assert hard_alignment(weights, [0, 1, 2], [0, 1, 2]) == [(0, 1), (1, 0), (2, 2)]
    assert hard_alignment(weights, [0, 0, 1], [0, 0, 1]) == [(0, 0), (1, 1)]
    assert pharaoh([(0, 0), (1, 2)]) == "0-0 1-2"


def test_translate_print_alignment_appends_pharaoh_links(tmp_path_factory, tmp_path):
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    src = tmp_path / "src.en"
    sentences = ["A red dog runs.", "", "A small cat sleeps here."]
    src.write_text("\n".join(sentences) + "\n")
    out = tmp_path / "hyp.de"
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "print_alignment=true"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert translate(compose("translate", [*overrides, "device=cpu"])) == 3
    lines = out.read_text().split("\n")[:-1]
    plain = Translator.from_checkpoint(ckpt, device="cpu").translate(sentences)
    assert len(lines) == 3 and lines[1] == "\t"
    for line, sentence, text in zip(lines, sentences, plain, strict=True):
        hyp, links = line.split("\t")
        assert hyp == text
        pairs = [tuple(map(int, p.split("-"))) for p in links.split()]
        assert all(re.fullmatch(r"\d+-\d+", p) for p in links.split())
        assert all(i < len(sentence.split()) and j < len(hyp.split()) for i, j in pairs)
        assert len({j for _, j in pairs}) == len(hyp.split())  # every target word aligned
