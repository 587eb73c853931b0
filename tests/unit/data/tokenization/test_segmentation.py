"""`litmt.data.tokenization.segmentation`: the n-best sampler draws what sentencepiece's own n-best sampler
draws (same distribution), and a seed gives the same segmentations in a new process, which
sentencepiece's generator does not promise (absl::BitGen salts its seed per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from tiny_corpora import make_pairs

from litmt.data.tokenization.segmentation import SubwordSampling, _scores, encode_texts, nbest_probs
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig

TEXT = "der hund läuft rot"  # a short sentence of the toy corpus's words


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> tuple[spm.SentencePieceProcessor, Path]:
    """A unigram model of 80 pieces over the toy corpus, and its file."""
    src, tgt = make_pairs(400, seed=3)
    tok = Tokenizer.train(src, tgt, TokenizerConfig(vocab_size=80))
    path = tmp_path_factory.mktemp("spm") / "src.model"
    path.write_bytes(tok.src_model_bytes)
    return tok.src, path


def test_nbest_probs_is_the_smoothed_softmax_of_the_scores() -> None:
    scores = [-10.0, -11.0, -13.5]
    expect = [np.exp(0.5 * s) for s in scores]
    np.testing.assert_allclose(nbest_probs(scores, 0.5), np.array(expect) / sum(expect))
    assert nbest_probs([-np.inf, -2.0], 1.0).tolist() == [0.0, 1.0]  # an impossible one
    assert nbest_probs([-np.inf, -np.inf], 1.0).tolist() == [0.5, 0.5]


@pytest.mark.parametrize("text", [TEXT, "der Ωhund läuft rot"])  # the second: an unknown piece
def test_the_nbest_sampler_draws_sentencepieces_distribution(proc: tuple, text: str) -> None:
    """4000 draws each of litmt's sampler (numpy seeds) and of sentencepiece's own nbest
    sampler (its seeds): the frequencies of the segmentations agree within 0.05 in total
    variation (sampling noise: about 0.02; alpha off by a half gives 0.10-0.17), and both
    follow softmax(alpha * score) of sentencepiece's n-best list. sentencepiece's draws
    differ per process (its generator), so the bound leaves five standard deviations."""
    sp, _ = proc
    nbest, alpha, n = 6, 0.1, 4000
    ours = Counter(
        tuple(encode_texts(sp, [text], SubwordSampling(alpha, nbest, seed=s))[0]) for s in range(n)
    )
    theirs: Counter = Counter()
    for s in range(n):
        spm.set_random_generator_seed(s + 1)
        ids = sp.encode([text], enable_sampling=True, alpha=alpha, nbest_size=nbest, num_threads=1)
        theirs[tuple(ids[0])] += 1
    best = sp.nbest_encode(text, nbest_size=nbest, out_type="proto").nbests
    expect = {tuple(p.id for p in b.pieces): q for b, q in
              zip(best, nbest_probs([b.score for b in best], alpha), strict=True)}  # fmt: skip
    assert len(expect) == nbest and max(expect.values()) < 0.8  # a real choice among six
    keys = set(ours) | set(theirs) | set(expect)
    assert keys == set(expect)  # only segmentations of the n-best list are drawn
    tv = 0.5 * sum(abs(ours[k] - theirs[k]) for k in keys) / n
    assert tv < 0.05, (tv, ours, theirs)
    assert 0.5 * sum(abs(ours[k] / n - expect[k]) for k in keys) < 0.04


def test_scores_summed_from_the_ids_are_sentencepieces(proc: tuple) -> None:
    """The fast path's scores (piece scores summed by id) equal the n-best proto's scores of
    sentencepiece, and a segmentation with an unknown or user-defined piece is left to the
    proto (its node scores are not piece scores)."""
    sp, _ = proc
    src, tgt = make_pairs(60, seed=5)
    for text in src + tgt:
        nbests = sp.nbest_encode(text, nbest_size=16, out_type="proto").nbests
        ours = _scores(sp).of([[p.id for p in n.pieces] for n in nbests])
        assert ours is not None
        np.testing.assert_allclose(ours, [n.score for n in nbests], rtol=0, atol=1e-3)
    unknown = sp.nbest_encode("Ω der hund", nbest_size=4, out_type=int)
    assert sp.unk_id() in unknown[0] and _scores(sp).of(unknown) is None
    tagged = Tokenizer.train(
        src, tgt, TokenizerConfig(vocab_size=80, user_defined_symbols=["<BT>"])
    )
    ids = tagged.src.nbest_encode("<BT> der hund", nbest_size=4, out_type=int)
    assert tagged.src.piece_to_id("<BT>") in ids[0] and _scores(tagged.src).of(ids) is None
    # the proto path: the sampled pieces keep the unknown surface, the ids the unknown id
    for seed in range(20):
        pieces = encode_texts(sp, ["Ω der hund"], SubwordSampling(0.1, 4, seed=seed), out_type=str)
        assert "".join(pieces[0]).replace("\u2581", " ").strip() == "Ω der hund"
        ids = encode_texts(sp, ["Ω der hund"], SubwordSampling(0.1, 4, seed=seed))[0]
        assert sp.unk_id() in ids and sp.decode(ids) == sp.decode(sp.encode("Ω der hund"))


def test_a_seed_gives_one_segmentation_and_others_vary(proc: tuple) -> None:
    sp, _ = proc
    texts = [TEXT, "ein mann sitzt im park", ""]
    one = encode_texts(sp, texts, SubwordSampling(0.2, 8, seed=11))
    assert encode_texts(sp, texts, SubwordSampling(0.2, 8, seed=11)) == one
    assert one[2] == []
    drawn = {tuple(map(tuple, encode_texts(sp, texts, SubwordSampling(0.2, 8, seed=s))))
             for s in range(40)}  # fmt: skip
    assert len(drawn) > 5
    # every sample is a segmentation of the same text
    pieces = encode_texts(sp, texts[:2], SubwordSampling(0.2, 8, seed=3), out_type=str)
    assert [sp.decode_pieces(p) for p in pieces] == texts[:2]
    assert [sp.decode(i) for i in one[:2]] == texts[:2]
    assert encode_texts(sp, texts, SubwordSampling(0.2, 1, seed=3)) == sp.encode(texts)


_CHILD = """
import json, sys
import sentencepiece as spm
from litmt.data.tokenization.segmentation import SubwordSampling, encode_texts
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
texts = ["der hund läuft rot", "die katze sitzt", "ein großer ball"] * 4
print(json.dumps([encode_texts(sp, texts, SubwordSampling(0.1, int(sys.argv[2]), seed=s))
                  for s in range(20)]))
"""


def _in_new_process(model: Path, nbest: int) -> list:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(nbest)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_the_nbest_sampler_repeats_in_a_new_process(proc: tuple) -> None:
    """The same seeds in two fresh interpreters and in this one: the same segmentations."""
    sp, model = proc
    first, second = _in_new_process(model, 8), _in_new_process(model, 8)
    assert first == second
    texts = ["der hund läuft rot", "die katze sitzt", "ein großer ball"] * 4
    here = [encode_texts(sp, texts, SubwordSampling(0.1, 8, seed=s)) for s in range(20)]
    assert here == first
    assert len({json.dumps(x) for x in first}) > 10  # the seeds do draw different ones
