"""ONNX export and the onnx engine: the step graph against the torch model, search parity
with the torch engine (pre-norm, post-norm + rotary, a multilingual target-tag model), int8,
config.json and the refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from parity import assert_parity
from tiny_checkpoint import (
    build_tiny_checkpoint,
    build_tiny_multilingual_checkpoint,
    corpus,
    tiny_checkpoint_path,
    tiny_config,
)

from litmt.checkpoint.io import save_model_checkpoint
from litmt.checkpoint.load import load_model
from litmt.data.tokenization.tokenizer import BOS_ID, Tokenizer, TokenizerConfig
from litmt.decoding.batching import padded
from litmt.decoding.translator import Translator
from litmt.deploy.engines.onnx import OnnxStepModel, OnnxTranslator
from litmt.deploy.export.base import ExportError
from litmt.deploy.export.onnx import export_onnx, read_onnx_config
from litmt.deploy.loader import load_translator
from litmt.errors import ConfigError
from litmt.metrics import corpus_bleu
from litmt.models import Seq2SeqTransformer

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

# The step graph computes attention in its own order of operations (matmul, softmax) where the
# torch engine calls its kernel (sdpa): on the tiny models the logits differ by ~1e-6.
STEP_ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint_path(tmp_path_factory)


@pytest.fixture(scope="module")
def onnx_dir(ckpt, tmp_path_factory) -> Path:
    return export_onnx(ckpt, tmp_path_factory.mktemp("onnx") / "fp32")


def held_sentences(n: int = 60) -> list[str]:
    """Template sentences in another order, half of them changed so the model never saw them."""
    en, _ = corpus(seed=1)
    half = n // 2
    return en[:half] + [s.replace("A ", "The ", 1).rstrip(".") for s in en[half:n]]


def _sources(translator: Translator, texts: list[str]) -> list[list[int]]:
    return [translator.prepare(t) for t in texts]


def _assert_parity(torch_engine: Translator, onnx_engine: OnnxTranslator, sources, **options):
    """Outputs equal by the parity rule (`parity.assert_parity`: a few sentences may part at a
    near-tie of the torch search, counted and capped); equal outputs score equally."""
    ref = torch_engine.search_ids(sources, **options)
    got = onnx_engine.search_ids(sources, **options)
    assert_parity(torch_engine, sources, ref, got, **options)
    return ref, got


def _torch_and_onnx_states(ckpt, onnx_dir):
    """The torch model and the ONNX step model, each with its decoder state of the same
    padded batch of 3 sources (src), and the first step's tokens (bos)."""
    model = load_model(ckpt).model
    step = OnnxStepModel(onnx_dir, read_onnx_config(onnx_dir), threads=1)
    src = padded([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], 0)
    memory, mask = model.encode(src)
    ref_state = model.init_state(memory, mask)
    state = step.init_state(*step.encode(src))
    return model, step, src, ref_state, state, torch.full((3,), BOS_ID)


def test_step_logits_equal_torch(ckpt, onnx_dir):
    """Encoder + decoder steps of the ONNX graphs give the torch model's logits (STEP_ATOL) on
    a padded batch, and follow row reorders (a beam step's, with and without the source side)
    like the torch state, while the cache stays an onnxruntime value between the steps."""
    import onnxruntime

    model, step, _, ref_state, state, tokens = _torch_and_onnx_states(ckpt, onnx_dir)
    for t in range(6):
        with torch.no_grad():
            ref = model.decode_step(tokens, ref_state)
        got = step.decode_step(tokens, state)
        torch.testing.assert_close(got, ref, atol=STEP_ATOL, rtol=0)
        if t == 2:  # rows move as beams do
            index = torch.tensor([2, 0, 0])
            ref_state.reorder(index, cross=True)
            state.reorder(index, cross=True)
        if t == 4:  # within their sentences: the source side stays
            index = torch.tensor([1, 1, 0])
            ref_state.reorder(index, cross=False)
            state.reorder(index, cross=False)
            assert state.beam_index.tolist() == [1, 1, 0] and state.moved  # gathered next
        tokens = ref.argmax(-1)
        # one value per layer and kind, never copied out to numpy
        assert all(isinstance(v, onnxruntime.OrtValue) for v in state.past)
    assert [tuple(v.shape()) for v in state.past] == [(3, 4, 6, 16)] * 4  # 2L of (R, H, P, D)


class _CountingSession:
    """An onnxruntime session that counts its runs (`OnnxStepModel.reorder`'s spy)."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        self.runs += 1
        self.session.run_with_iobinding(binding)


def test_only_moved_rows_are_gathered(ckpt, onnx_dir):
    """The graph only appends: a step after rows moved gathers the past first (the reorder
    session, once), a reorder that keeps every row in place gathers nothing, and the logits
    equal the torch model's either way."""
    model, step, _, ref_state, state, tokens = _torch_and_onnx_states(ckpt, onnx_dir)
    step.reorder = spy = _CountingSession(step.reorder)
    reorders = {1: [0, 1, 2], 2: [2, 0, 0], 3: [0, 1, 2], 4: [1, 2]}
    runs_after = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2}  # reorders run by step t
    for t in range(6):
        with torch.no_grad():
            ref = model.decode_step(tokens, ref_state)
        got = step.decode_step(tokens, state)
        assert spy.runs == runs_after[t]
        torch.testing.assert_close(got, ref, atol=STEP_ATOL, rtol=0)
        tokens = ref.argmax(-1)
        if t in reorders:
            index = torch.tensor(reorders[t])
            ref_state.reorder(index, cross=True)
            state.reorder(index, cross=True)
            tokens = tokens.index_select(0, index)
            assert state.moved == (t in (2, 4))


def test_only_searches_that_move_rows_gather(ckpt, onnx_dir, monkeypatch):
    """A search whose rows never move (sampling; greedy that keeps its finished rows) runs
    no reorder; greedy that drops finished rows and beam search do, and still give the
    torch engine's outputs."""
    import litmt.decoding.search.greedy as greedy

    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    onnx_engine = OnnxTranslator(onnx_dir, threads=1)
    onnx_engine.step_model.reorder = spy = _CountingSession(onnx_engine.step_model.reorder)
    sources = _sources(torch_engine, held_sentences(20))
    onnx_engine.search_ids(sources, method="sample", seed=3)
    assert spy.runs == 0
    with monkeypatch.context() as patch:
        patch.setattr(greedy, "DROP_FINISHED_SHARE", 2.0)  # never
        _assert_parity(torch_engine, onnx_engine, sources, beam_size=1)
    assert spy.runs == 0
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=1)
    assert spy.runs > 0
    spy.runs = 0
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=3)
    assert spy.runs > 0


def test_engine_without_onnx_says_how_to_install_it(onnx_dir, monkeypatch):
    """engine=onnx builds its reorder graph with onnx: without the package, one line says
    which extra to install."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(
        ExportError, match=r"need onnx and onnxruntime: pip install 'litmt\[onnx\]'"
    ):
        OnnxTranslator(onnx_dir, threads=1)


def test_beams_read_their_sentence_once(ckpt, onnx_dir):
    """A beam search's fan-out to K rows per sentence keeps each sentence's source side once
    (the graph reads it for the K rows), a drop of whole sentences keeps the others once, and
    rows in uneven runs get a copy each; the logits equal the torch model's throughout."""
    model, step, src, ref_state, state, tokens = _torch_and_onnx_states(ckpt, onnx_dir)
    reorders = {
        0: ([0, 0, 0, 1, 1, 1, 2, 2, 2], True, 3, [0, 1, 2]),  # fan-out to K = 3
        1: ([2, 1, 0, 3, 3, 5, 8, 6, 7], False, 3, [0, 1, 2]),  # beams move in their sentence
        2: ([0, 1, 2, 6, 7, 8], True, 3, [0, 2]),  # sentence 1 is done
        3: ([0, 0, 3, 4, 5, 5], False, 3, [0, 2]),
        4: ([0, 1, 2, 3, 4, 1], True, 1, [0, 0, 0, 2, 2, 0]),  # uneven runs: a copy per row
    }
    for t in range(6):
        with torch.no_grad():
            ref = model.decode_step(tokens, ref_state)
        got = step.decode_step(tokens, state)
        torch.testing.assert_close(got, ref, atol=STEP_ATOL, rtol=0)
        tokens = ref.argmax(-1)
        if t in reorders:
            rows, cross, group, sources = reorders[t]
            index = torch.tensor(rows)
            ref_state.reorder(index, cross=cross)
            state.reorder(index, cross=cross)
            tokens = tokens.index_select(0, index)
            assert state.group == group
            assert state.src_ids.tolist() == [src[i].tolist() for i in sources]
            assert all(t.size(0) == len(sources) for t in state.cross)


def test_searches_without_a_beam_run_in_smaller_batches(onnx_dir, monkeypatch):
    """Greedy and sampling split a batch into equal parts of about UNBEAMED_MAX_TOKENS padded
    source tokens or fewer (their steps copy the whole cache; the parts' sizes differ by at
    most one sentence, so at most one sentence's tokens over), beam search keeps the caller's
    budget; the outputs do not depend on the batching."""
    from litmt.deploy.engines import onnx as onnx_engine
    from litmt.deploy.engines.onnx import UNBEAMED_MAX_TOKENS

    translator = OnnxTranslator(onnx_dir, threads=1)
    sizes: list[int] = []
    encode = translator.step_model.encode

    def counting(src):
        sizes.append(src.numel())  # (B, S) padded tokens of the batch
        rows.append(src.size(0))
        return encode(src)

    rows: list[int] = []

    translator.step_model.encode = counting
    sources = _sources(translator, held_sentences(60) * 12)  # 720 sentences, one length
    sources = [s[:8] + [s[0]] * (8 - len(s[:8])) for s in sources]  # of 8 tokens each
    budget = 3 * UNBEAMED_MAX_TOKENS  # 768 sentences of 8 a batch: one batch of all 720
    options = dict(max_len_a=0.0, max_len_b=4, max_tokens=budget)
    small = translator.search_ids(sources, beam_size=1, **options)
    # 5,760 tokens in 3 parts of 240 sentences (filling up to the budget: 256 + 256 + 208)
    assert rows == [240] * 3 and max(sizes) <= UNBEAMED_MAX_TOKENS
    sizes.clear(), rows.clear()
    translator.search_ids(sources, beam_size=2, **options)
    assert rows == [720]
    sizes.clear(), rows.clear()
    translator.search_ids(sources, method="sample", seed=3, **options)
    assert rows == [240] * 3
    monkeypatch.setattr(onnx_engine, "UNBEAMED_MAX_TOKENS", 1 << 20)  # one batch
    sizes.clear()
    whole = translator.search_ids(sources, beam_size=1, **{**options, "max_tokens": 1 << 16})
    assert len(sizes) == 1
    assert [h[0].tokens for h in small] == [h[0].tokens for h in whole]


def test_sessions_do_not_spin_between_steps(onnx_dir):
    """The engine's sessions spin only inside a run: their workers stop when a run returns
    (spinning ones take the cores from the search's torch threads between two decoder
    steps), and spin between a step's operators (waking a sleeping one for each is slower)."""
    step = OnnxStepModel(onnx_dir, read_onnx_config(onnx_dir), threads=2)
    for session in (step.encoder, step.decoder, step.reorder):
        options = session.get_session_options()
        assert options.get_session_config_entry("session.force_spinning_stop") == "1"
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_shared_weights_are_stored_once(ckpt, onnx_dir):
    """The tied embedding (the encoder's source embedding, the decoder's target embedding and
    output projection) and the position table are one copy in shared.bin, which both graphs
    name; the decoder holds no transposed copy of the projection."""
    import onnx

    meta = read_onnx_config(onnx_dir)
    assert meta["files"]["shared"] == "shared.bin"
    cfg = load_model(ckpt).model.config
    vocab = (cfg.tgt_vocab_size, cfg.d_model)
    external = {}
    for name in ("encoder.onnx", "decoder.onnx"):
        graph = onnx.load(str(onnx_dir / name), load_external_data=False).graph
        shapes = [tuple(t.dims) for t in graph.initializer]
        assert vocab[::-1] not in shapes  # no (C, V) transposed copy
        external[name] = {
            (tuple(t.dims), tuple((e.key, e.value) for e in t.external_data))
            for t in graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
        }
    assert external["encoder.onnx"] == external["decoder.onnx"]  # the same bytes of one file
    assert vocab in {dims for dims, _ in external["decoder.onnx"]}
    size = (onnx_dir / "shared.bin").stat().st_size
    assert size == sum(int(dict(e)["length"]) for _, e in external["decoder.onnx"])


def test_greedy_and_beam_equal_torch(ckpt, onnx_dir):
    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    onnx_engine = load_translator(onnx_dir, engine="onnx", threads=1)
    sources = _sources(torch_engine, held_sentences())
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=1)
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=5)
    _assert_parity(torch_engine, onnx_engine, sources[:20], beam_size=4, n_best=3)
    prefix = torch_engine.tokenizer.encode_tgt(["Ein großer"])[0]
    _, got = _assert_parity(
        torch_engine, onnx_engine, sources[:10], beam_size=3, prefixes=[prefix] * 10
    )
    assert all(h[0].tokens[: len(prefix)] == prefix for h in got)


def test_post_norm_rotary_model(tmp_path):
    """A post-norm model with rotary positions (the other code paths of the graphs)."""
    ckpt = build_tiny_checkpoint(tmp_path, steps=40, norm_first=False, positional="rope")
    out = export_onnx(ckpt, tmp_path / "onnx")
    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    onnx_engine = OnnxTranslator(out, threads=1)
    sources = _sources(torch_engine, held_sentences(30))
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=1)
    _assert_parity(torch_engine, onnx_engine, sources, beam_size=5)


def test_multilingual_target_tag(tmp_path):
    """A model whose <2xx> tag is the first target token (forced as a one-token prefix, as the
    text side routes it), its tags in config.json."""
    ckpt = build_tiny_multilingual_checkpoint(tmp_path, placement="target", steps=40)
    out = export_onnx(ckpt, tmp_path / "onnx")
    meta = json.loads((out / "config.json").read_text())
    assert meta["tag_placement"] == "target"
    assert set(meta["tags"]) == {"<2de>", "<2fr>"}
    assert sorted(meta["tags"].values()) == meta["lang_tag_ids"]
    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    onnx_engine = OnnxTranslator(out, threads=1)
    sources = _sources(torch_engine, held_sentences(20))
    for lang in ("de", "fr"):
        tag = torch_engine.route(tgt_lang=lang).tag_id
        for beam in (1, 4):
            _assert_parity(
                torch_engine, onnx_engine, sources, beam_size=beam, prefixes=[[tag]] * 20
            )
    texts = onnx_engine.translate(held_sentences(5), tgt_lang="fr")
    assert texts and not any("<2" in t for t in texts)  # the tag is not part of the text


def test_imported_marian(tmp_path):
    """A model imported from transformers' Marian: post-norm, Marian's split sinusoids, an
    output bias, separate embedding tables and a piece vocabulary (pieces.json, src_eos)."""
    pytest.importorskip("transformers")
    from benchmarks.hf_models import EN_WORDS, make_marian_dir, sentences
    from litmt.checkpoint.hf_import import read_hf_dir

    directory = make_marian_dir(tmp_path / "m", layers=2, tie=False, init_std=0.3, eos_bias=2.5)
    imported = read_hf_dir(directory)
    model = Seq2SeqTransformer(imported.config)
    model.load_state_dict(imported.weights)
    ckpt = save_model_checkpoint(tmp_path / "m.ckpt", model, imported.tokenizer, "en", "de")
    out = export_onnx(ckpt, tmp_path / "onnx")
    meta = read_onnx_config(out)
    assert meta["tokenizer"]["pieces"] == "pieces.json" and meta["tokenizer"]["src_eos"]
    torch_engine = Translator.from_checkpoint(ckpt, device="cpu")
    onnx_engine = OnnxTranslator(out, threads=1)
    sources = imported.tokenizer.encode_src(sentences(EN_WORDS, 30, seed=21))
    for beam in (1, 5):
        _assert_parity(
            torch_engine, onnx_engine, sources, beam_size=beam, max_len_a=0.0, max_len_b=20
        )


def test_config_json(onnx_dir, ckpt):
    meta = read_onnx_config(onnx_dir)
    cfg = load_model(ckpt).model.config
    assert meta["format"] == "litmt-onnx" and meta["format_version"] == 6
    assert meta["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert (meta["src_lang"], meta["tgt_lang"]) == ("en", "de")
    assert meta["model"]["n_decoder_layers"] == cfg.n_decoder_layers
    assert meta["model"]["head_dim"] == cfg.d_model // cfg.n_heads
    assert cfg.n_decoder_layers == 2
    assert meta["inputs"] == {
        "encoder": ["src_ids"],
        "decoder": ["tokens", "src_ids", "cross_k_0", "cross_k_1", "cross_v_0", "cross_v_1",
                    "self_k_0", "self_k_1", "self_v_0", "self_v_1"],
    }  # fmt: skip
    assert meta["outputs"] == {
        "encoder": ["cross_k_0", "cross_k_1", "cross_v_0", "cross_v_1"],
        "decoder": ["logits", "new_self_k_0", "new_self_k_1", "new_self_v_0", "new_self_v_1"],
    }
    assert meta["files"] == {
        "encoder": "encoder.onnx", "decoder": "decoder.onnx", "shared": "shared.bin"
    }  # fmt: skip
    assert meta["tokenizer"] == {
        "src_model": "src.model", "tgt_model": None, "pieces": None, "src_eos": False, "joint": True
    }  # fmt: skip
    assert {p.name for p in onnx_dir.iterdir()} == {
        "config.json", "encoder.onnx", "decoder.onnx", "shared.bin", "src.model"
    }  # fmt: skip


def test_an_older_export_is_refused_saying_to_export_again(onnx_dir, tmp_path):
    import shutil

    old = shutil.copytree(onnx_dir, tmp_path / "v2")
    meta = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**meta, "format_version": 2}))
    with pytest.raises(ExportError, match=r"version 2, this litmt reads 6: export it again"):
        OnnxTranslator(old)


def test_int8_export(ckpt, onnx_dir, tmp_path):
    """int8 changes the numbers, so outputs are compared by agreement, not equality: on the
    tiny model int8 greedy output stays within 5 BLEU of the float32 export's."""
    out = export_onnx(ckpt, tmp_path / "int8", quantization="int8")
    assert read_onnx_config(out)["quantization"] == "int8"
    size = lambda d: sum(p.stat().st_size for p in d.glob("*.onnx"))  # noqa: E731
    assert size(out) < 0.6 * size(onnx_dir)
    assert read_onnx_config(out)["files"]["shared"] == "shared.bin"  # the embedding, once
    texts = held_sentences(40)
    ref = OnnxTranslator(onnx_dir, threads=1).translate(texts, beam_size=1)
    got = OnnxTranslator(out, threads=1).translate(texts, beam_size=1)
    assert corpus_bleu(got, [ref]) >= 95.0


def test_refusals(ckpt, onnx_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"format=onnx supports quantization none \| int8"):
        export_onnx(ckpt, tmp_path / "x", quantization="float16")
    with pytest.raises(ConfigError, match="already exists; pass force=true"):
        export_onnx(ckpt, onnx_dir)
    with pytest.raises(ConfigError, match="engine=onnx does not ensemble"):
        load_translator([ckpt, ckpt], engine="onnx", ensemble=True)
    with pytest.raises(ConfigError, match="is an ONNX export: decode it with engine=onnx"):
        load_translator(onnx_dir, engine="torch")
    with pytest.raises(ConfigError, match="engine=onnx runs on the CPU"):
        load_translator(onnx_dir, engine="onnx", device="cuda")
    with pytest.raises(ExportError, match="is not a litmt ONNX export"):
        load_translator(tmp_path, engine="onnx")
    with pytest.raises(ConfigError, match="valid values: torch, ct2, onnx"):
        load_translator(onnx_dir, engine="tflite")


def test_refuses_approximate_attention(tmp_path):
    en, de = corpus()
    tok = Tokenizer.train(en, de, TokenizerConfig(vocab_size=80, model_type="unigram"))
    config = tiny_config(tok.src_vocab_size)
    config.attention.decoder_self, config.attention.decoder_self_options = "local", {"window": 4}
    path = save_model_checkpoint(
        tmp_path / "local.ckpt", Seq2SeqTransformer(config), tok, "en", "de"
    )
    with pytest.raises(
        ExportError, match=r"model.attention.decoder_self=local is an approximate attention"
    ):
        export_onnx(path, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_ckpt_exported_on_first_use(ckpt, tmp_path):
    """engine=onnx with a .ckpt exports it once into the cache, named by its sha256."""
    first = OnnxTranslator.from_pretrained(ckpt, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    assert entry.name.startswith("tiny-") and entry.name.endswith("-none")
    mtime = (entry / "decoder.onnx").stat().st_mtime_ns
    second = OnnxTranslator.from_pretrained(ckpt, cache_dir=tmp_path)
    assert (entry / "decoder.onnx").stat().st_mtime_ns == mtime
    assert first.translate(["A red dog runs."]) == second.translate(["A red dog runs."])


def test_a_cached_export_of_another_version_is_exported_again(ckpt, tmp_path):
    """A cache entry an older litmt wrote (format version 2) is replaced, not refused."""
    OnnxTranslator.from_pretrained(ckpt, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    meta = json.loads((entry / "config.json").read_text())
    (entry / "config.json").write_text(json.dumps({**meta, "format_version": 2}))
    again = OnnxTranslator.from_pretrained(ckpt, cache_dir=tmp_path)
    assert read_onnx_config(entry)["format_version"] == 6
    assert again.translate(["A red dog runs."])
