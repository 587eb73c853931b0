"""Import parity: random-weight transformers `MarianMTModel`s (tied and untied, relu and swish,
non-zero final_logits_bias, 1 to 3 layers), saved with `save_pretrained` and imported, give
transformers' logits (fp32, within 1e-4) and `generate`'s greedy and beam-4 outputs (ids and
text); a sentence may differ only where litmt's search meets a near-tie (`parity.assert_parity`: where the outputs part, at most `parity.EXCUSE_CAP` of them).

The beam comparison uses length_penalty=0 in both: litmt's penalty is GNMT's
((5 + n) / 6) ** alpha, transformers' n ** alpha, so only alpha = 0 is the same rule. The stop
rules then agree on the best hypothesis: transformers (early_stopping=True) stops a sentence
with K finished hypotheses, litmt too, or earlier when the best finished one already beats
every live beam (at alpha = 0 no live beam can overtake it). The length limit is the same:
litmt's budget of L tokens before a forced eos is transformers' max_new_tokens = L + 1 with
Marian's forced_eos_token_id; litmt's min_len is transformers' min_new_tokens.

One rule differs, at that limit: transformers forces eos by setting its log-probability to 0
(``ForcedEOSTokenLogitsProcessor`` runs on the log-softmax), litmt (and CTranslate2) count
eos's own log-probability. Greedy outputs are the same; beams that reach the limit may rank
differently, so the beam comparison counts the sentences whose outputs (both) end before
the limit: at least `N_SENTENCES` of them.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from parity import assert_parity

from benchmarks.hf_models import EN_WORDS, make_marian_dir, sentences
from litmt.checkpoint.hf_import import read_hf_dir, read_marian_dir
from litmt.data.tokenization.tokenizer import EOS_ID
from litmt.decoding.translator import Translator
from litmt.errors import CheckpointError
from litmt.models import Seq2SeqTransformer

N_SENTENCES = 50
BUDGET = 20  # tokens before eos (litmt: max_len_a=0, max_len_b=BUDGET)

# init_std and eos_bias chosen so that the random models' outputs end at several lengths
# (random post-norm models are nearly input-independent; a larger eos bias ends them all at once)
CONFIGS = {
    "tied-swish-1": dict(layers=1, activation="swish", tie=True, init_std=0.3, eos_bias=2.5),
    "untied-relu-2": dict(layers=2, activation="relu", tie=False, eos_bias=2.0),
    "tied-relu-3": dict(layers=3, activation="relu", tie=True, init_std=0.3, eos_bias=2.5),
    "untied-swish-2-unscaled": dict(
        layers=2, activation="swish", tie=False, scale_embedding=False, eos_bias=2.5
    ),
    "tied-gelu-3-unscaled": dict(
        layers=3, activation="gelu", tie=True, scale_embedding=False, init_std=0.3, eos_bias=2.5
    ),
}


def _load(directory):
    from transformers import MarianMTModel, MarianTokenizer

    imported = read_marian_dir(directory)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    translator = Translator(model, imported.tokenizer, device="cpu")
    hf = MarianMTModel.from_pretrained(directory).eval()
    return imported, translator, hf, MarianTokenizer.from_pretrained(directory)


def _hf_to_litmt(imported, rows: list[list[int]]) -> list[list[int]]:
    """transformers output ids (decoder start first) as litmt ids, without start and eos."""
    litmt_of = {m: i for i, m in enumerate(imported.marian_ids)}
    out = []
    for row in rows:
        ids = [litmt_of[t] for t in row[1:]]
        out.append(ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids)
    return out


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def marian(request, tmp_path_factory):
    directory = make_marian_dir(tmp_path_factory.mktemp(request.param), **CONFIGS[request.param])
    return _load(directory)


def test_config_is_mapped(marian):
    imported, _, hf, _ = marian
    cfg = imported.config
    assert cfg.tie_output == bool(hf.config.tie_word_embeddings)
    assert cfg.activation == {"swish": "silu"}.get(
        hf.config.activation_function, hf.config.activation_function
    )
    assert cfg.n_encoder_layers == hf.config.encoder_layers
    assert imported.weights["output_bias"].abs().max() > 0  # a non-zero final_logits_bias


def test_source_ids_match_marian_tokenizer(marian):
    imported, _, _, tok = marian
    texts = [*sentences(EN_WORDS, N_SENTENCES, seed=11), "unseen Ωmega ünïcode"]
    ours = imported.tokenizer.encode_src(texts)
    theirs = tok(texts)["input_ids"]
    assert [[imported.marian_ids[i] for i in s] for s in ours] == theirs


def test_logits_match(marian):
    imported, translator, hf, tok = marian
    texts = sentences(EN_WORDS, 8, seed=12)
    enc = tok(texts, return_tensors="pt", padding=True)
    g = torch.Generator().manual_seed(0)
    dec_marian = torch.randint(0, len(imported.marian_ids) - 1, (len(texts), 9), generator=g)
    dec_marian[:, 0] = hf.config.decoder_start_token_id
    litmt_of = {m: i for i, m in enumerate(imported.marian_ids)}
    src = [imported.tokenizer.encode_src([t])[0] for t in texts]
    width = max(map(len, src))
    src_t = torch.tensor([s + [0] * (width - len(s)) for s in src])  # (B, S)
    dec_t = torch.tensor([[litmt_of[t] for t in row] for row in dec_marian.tolist()])  # (B, T)
    with torch.no_grad():
        theirs = hf(**enc, decoder_input_ids=dec_marian).logits  # (B, T, V)
        ours = translator.model(src_t, dec_t)  # (B, T, V + 1)
    order = torch.tensor([litmt_of[m] for m in range(theirs.size(-1))])
    assert (ours[..., order] - theirs).abs().max().item() < 1e-4
    assert ours[..., 0].max().item() < -1e3  # litmt's pad row is never predicted


@pytest.mark.parametrize("beam", [1, 4])
def test_search_matches_generate(marian, beam):
    imported, translator, hf, tok = marian
    texts = sentences(EN_WORDS, N_SENTENCES if beam == 1 else 3 * N_SENTENCES, seed=13)
    enc = tok(texts, return_tensors="pt", padding=True)
    min_len = 0 if beam == 1 else 3  # at alpha = 0 a random model's best beam is often empty
    with torch.no_grad():
        out = hf.generate(
            **enc, num_beams=beam, do_sample=False, length_penalty=0.0, early_stopping=True,
            max_new_tokens=BUDGET + 1, min_new_tokens=min_len,
        )  # fmt: skip
    theirs = _hf_to_litmt(imported, out.tolist())
    sources = imported.tokenizer.encode_src(texts)
    options = dict(
        beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=BUDGET, min_len=min_len
    )
    ours = [h[0].tokens for h in translator.search_ids(sources, method="beam", **options)]
    texts_ours = translator.tokenizer.decode_tgt(ours)
    texts_theirs = tok.batch_decode(out, skip_special_tokens=True)
    assert len({len(t) for t in ours}) >= 2  # not all at the limit, not all empty
    assert len({tuple(t) for t in ours}) >= 2
    if beam > 1:  # see the module docstring: the limit's rule differs
        keep = [
            i
            for i, (a, b) in enumerate(zip(theirs, ours, strict=True))
            if max(len(a), len(b)) < BUDGET
        ]
        assert len(keep) >= N_SENTENCES, f"only {len(keep)} outputs end before the limit"
        sources, theirs, ours = ([x[i] for i in keep] for x in (sources, theirs, ours))
        texts_ours, texts_theirs = ([x[i] for i in keep] for x in (texts_ours, texts_theirs))
    differ = assert_parity(translator, sources, theirs, ours, **options).differ
    same = sum(a == b for a, b in zip(texts_ours, texts_theirs, strict=True))
    assert same >= len(ours) - differ


def test_unmappable_fields_are_refused(tmp_path):
    import json

    directory = make_marian_dir(tmp_path / "m", layers=1)
    cfg = json.loads((directory / "config.json").read_text())
    for field, value, expected in (
        ("activation_function", "gelu_new", r"activation_function='gelu_new'"),
        ("decoder_ffn_dim", 7, "decoder_ffn_dim=7"),
        ("model_type", "bart", "model_type='bart'"),
    ):
        (directory / "config.json").write_text(json.dumps({**cfg, field: value}))
        with pytest.raises(CheckpointError, match=expected) as err:
            read_marian_dir(directory)
        assert "\n" not in str(err.value)


def test_import_script(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    directory = make_marian_dir(tmp_path / "m", layers=1)
    script = [sys.executable, str(root / "scripts/import_hf.py")]
    out = tmp_path / "m.ckpt"
    res = subprocess.run(
        [*script, f"model_dir={directory}", f"out={out}"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    translator = Translator.from_checkpoint(out, device="cpu")
    assert (translator.src_lang, translator.tgt_lang) == ("en", "de")
    res = subprocess.run(
        [*script, f"model_dir={tmp_path}", f"out={tmp_path / 'x.ckpt'}"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path} has no config.json; pass a MarianMTModel save_pretrained directory "
        "(config.json, model.safetensors, source.spm, target.spm, vocab.json)"
    )


def test_imported_model_exports_to_ct2(tmp_path):
    pytest.importorskip("ctranslate2")
    from litmt.checkpoint.io import save_model_checkpoint
    from litmt.deploy.export.ct2 import export_model
    from litmt.deploy.loader import load_translator

    directory = make_marian_dir(tmp_path / "m", layers=2, tie=False, init_std=0.3, eos_bias=2.5)
    imported = read_hf_dir(directory)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    ckpt = save_model_checkpoint(tmp_path / "m.ckpt", model, imported.tokenizer, "en", "de")
    ct2 = load_translator(export_model(ckpt, tmp_path / "ct2"), engine="ct2", device="cpu")
    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    sources = imported.tokenizer.encode_src(sentences(EN_WORDS, 30, seed=21))
    options = dict(beam_size=1, max_len_a=0.0, max_len_b=BUDGET)
    ref = [h[0].tokens for h in torch_engine.search_ids(sources, **options)]
    got = [h[0].tokens for h in ct2.search_ids(sources, **options)]
    assert_parity(torch_engine, sources, ref, got, **options)
