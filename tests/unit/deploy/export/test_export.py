"""CTranslate2 export and the ct2 engine: round trip against litmt's own search, variants,
quantization, refusals, metadata, the conversion cache and the export script."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")

from parity import SCORE_ATOL, assert_parity  # noqa: E402
from tiny_checkpoint import corpus, other_weights, tiny_checkpoint_path  # noqa: E402

from litmt.checkpoint.io import save_model_checkpoint  # noqa: E402
from litmt.checkpoint.load import load_model  # noqa: E402
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, Tokenizer, TokenizerConfig  # noqa: E402
from litmt.decoding.analysis.forced import ForcedDecoder  # noqa: E402
from litmt.decoding.translator import Translator  # noqa: E402
from litmt.deploy.engines.ct2 import CT2Translator  # noqa: E402
from litmt.deploy.export.base import ExportError  # noqa: E402
from litmt.deploy.export.ct2 import export_model, read_metadata  # noqa: E402
from litmt.deploy.loader import load_translator  # noqa: E402
from litmt.errors import ConfigError  # noqa: E402
from litmt.metrics import corpus_bleu  # noqa: E402
from litmt.models import Seq2SeqTransformer, TransformerConfig  # noqa: E402

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint_path(tmp_path_factory)


@pytest.fixture(scope="module")
def export_dir(ckpt, tmp_path_factory) -> Path:
    return export_model(ckpt, tmp_path_factory.mktemp("ct2") / "float32")


@pytest.fixture(scope="module")
def engines(ckpt, export_dir) -> tuple[Translator, CT2Translator]:
    return Translator.from_checkpoint(ckpt, device="cpu"), CT2Translator(export_dir, threads=1)


def held_sentences() -> list[str]:
    """200 sentences: template ones in another order plus variants the model never saw."""
    en, _ = corpus(seed=1)
    seen = en[:100]
    unseen = [s.replace("A ", "The ", 1).rstrip(".") for s in en[100:150]]
    unseen += [f"{s} {t.lower()}" for s, t in zip(en[150:200], en[200:250], strict=True)]
    return seen + unseen


def test_ct2_float32_greedy_equals_litmt_greedy_token_for_token(engines):
    """Token for token, except at a few near-ties where the outputs part (tests/helpers/parity.py);
    the scores of identical outputs are litmt's (GNMT-normalised log-probs of the same tokens)."""
    torch_engine, ct2_engine = engines
    ids = [torch_engine.prepare(s) for s in held_sentences()]
    ref = torch_engine.search_ids(ids, beam_size=1)
    got = ct2_engine.search_ids(ids, beam_size=1)
    assert_parity(torch_engine, ids, ref, got)


def test_parallel_budget_groups_give_the_same_results_in_input_order(engines, export_dir):
    """threads=2 on the CPU decodes the per-budget groups concurrently (inter_threads=2)."""
    torch_engine, serial = engines
    parallel = CT2Translator(export_dir, threads=2)
    assert parallel.ct2.num_translators == 2  # two groups in flight at once
    ids = [torch_engine.prepare(s) for s in held_sentences()[::2]]
    assert len({len(i) for i in ids}) > 3  # several budget groups
    for options in (dict(beam_size=1), dict(beam_size=4, n_best=2)):
        want = serial.search_ids(ids, **options)
        got = parallel.search_ids(ids, **options)
        assert [[h.tokens for h in r] for r in got] == [[h.tokens for h in r] for r in want]


def test_default_threads_run_torchs_count_of_ct2_workers(export_dir):
    """threads=0 (the default): torch's thread count of one-thread workers, not CTranslate2's
    own intra_threads=4, which oversubscribes a small machine (litmt.runtime.threads)."""
    assert CT2Translator(export_dir).ct2.num_translators == torch.get_num_threads()


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_length_penalty_and_nbest_mean_the_same_on_both_engines(engines, alpha):
    """CTranslate2 divides by len**alpha, litmt by GNMT ((5+n)/6)**alpha: the engine rescores.

    A hypothesis both engines return has the same score under both; the n-best lists are
    identical wherever litmt's search decides with a clear margin (tests/helpers/parity.py); where
    they differ, each hypothesis only one engine kept is worth the same under the other.
    """
    torch_engine, ct2_engine = engines
    ids = [torch_engine.prepare(s) for s in held_sentences()[::4]]
    options = dict(beam_size=4, n_best=3, length_penalty=alpha)
    ref = torch_engine.search_ids(ids, **options)
    got = ct2_engine.search_ids(ids, **options)
    forced_decoder = ForcedDecoder(torch_engine)
    for src, a, b in zip(ids, ref, got, strict=True):
        for hyps in (a, b):
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        mine = {tuple(h.tokens): h for h in a}
        for h in b:
            if tuple(h.tokens) in mine:
                assert h.score == pytest.approx(mine[tuple(h.tokens)].score, abs=SCORE_ATOL)
                assert h.log_prob == pytest.approx(mine[tuple(h.tokens)].log_prob, abs=SCORE_ATOL)
            else:  # found by ct2's search only: litmt scores it as ct2 does
                forced = forced_decoder.force_decode_ids([src], [h.tokens], length_penalty=alpha)[0]
                assert forced.score == pytest.approx(h.score, abs=SCORE_ATOL)
    assert_parity(torch_engine, ids, ref, got, **options)


def test_budget_and_min_len_mean_the_same(engines):
    torch_engine, ct2_engine = engines
    ids = [torch_engine.prepare(s) for s in held_sentences()[:40]]
    for options in (dict(max_len_a=0.0, max_len_b=3), dict(max_len_a=0.5, max_len_b=0)):
        ref = torch_engine.search_ids(ids, beam_size=3, **options)
        got = ct2_engine.search_ids(ids, beam_size=3, **options)
        assert_parity(torch_engine, ids, ref, got, beam_size=3, **options)
        budgets = [int(options["max_len_a"] * len(src) + options["max_len_b"]) for src in ids]
        assert all(len(h[0].tokens) <= cap for h, cap in zip(got, budgets, strict=True))
        assert any(len(h[0].tokens) == cap for h, cap in zip(got, budgets, strict=True))
    ref = torch_engine.search_ids(ids, beam_size=1, min_len=12)
    got = ct2_engine.search_ids(ids, beam_size=1, min_len=12)
    assert_parity(torch_engine, ids, ref, got)
    assert all(len(h[0].tokens) >= 12 for h in got)


def test_ct2_translate_keeps_input_hygiene_and_order(engines):
    torch_engine, ct2_engine = engines
    lines = ["A red dog runs.", "", "  ", "A big\x07 man sleeps here.", "A young bird sings today."]
    ref, got = (e.translate(lines, beam_size=2) for e in (torch_engine, ct2_engine))
    assert_parity(torch_engine, [torch_engine.prepare(x) for x in lines], ref, got, beam_size=2)
    assert ct2_engine.translate(lines, beam_size=2)[1:3] == ["", ""]


@pytest.mark.parametrize(
    "quantization", ["int8", "int8_float32", "int8_float16", "float16", "bfloat16"]
)
def test_quantized_exports_load_and_translate(ckpt, export_dir, tmp_path, quantization):
    out = export_model(ckpt, tmp_path / quantization, quantization=quantization)
    assert read_metadata(out)["quantization"] == quantization
    assert (out / "model.bin").stat().st_size < 0.7 * (export_dir / "model.bin").stat().st_size
    sentences = held_sentences()[:30]
    got = CT2Translator(out, threads=1).translate(sentences, beam_size=2)
    ref = CT2Translator(export_dir, threads=1).translate(sentences, beam_size=2)
    assert all(got), "every sentence gets a translation"
    assert sum(a == b for a, b in zip(got, ref, strict=True)) >= 0.8 * len(sentences)


def _random_variant(tmp_path: Path, tokenizer: Tokenizer, **overrides) -> Path:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        d_model=32,
        n_heads=4,
        d_ff=48,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=40,
        **overrides,
    )
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():  # non-trivial norms and biases too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return save_model_checkpoint(tmp_path / "variant.ckpt", model, tokenizer, "en", "de")


VARIANTS = {
    "pre-norm sinusoidal": {},
    "post-norm": {"norm_first": False, "layer_norm_eps": 1e-6},
    "learned positions": {"positional": "learned"},
    "rope": {"positional": "rope"},
    "separate vocab, untied output": {"share_embeddings": False, "tie_output": False},
    "separate vocab, tied output": {"share_embeddings": False},
    "no embedding scaling": {"scale_embeddings": False},
    "gelu": {"activation": "gelu"},
    "swiglu": {"activation": "swiglu"},
    "no biases": {"bias": False},
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_architecture_variant_scores_like_litmt(ckpt, tmp_path, name):
    """Teacher-forced log-probs of CTranslate2 (`score_batch`) equal the torch model's."""
    overrides = VARIANTS[name]
    en, de = corpus()
    if overrides.get("share_embeddings") is False:
        tokenizer = Tokenizer.train(en, de, TokenizerConfig(vocab_size=60, joint=False))
    else:
        tokenizer = load_model(ckpt).tokenizer
    path = _random_variant(tmp_path, tokenizer, **overrides)
    model = load_model(path).model
    out = export_model(path, tmp_path / "ct2")
    scorer = ctranslate2.Translator(str(out), intra_threads=1)
    src, tgt = tokenizer.encode_src(en[:6]), tokenizer.encode_tgt(de[:6])
    results = scorer.score_batch(
        [tokenizer.src_pieces(s) for s in src], [tokenizer.tgt_pieces(t) for t in tgt]
    )
    for s, t, result in zip(src, tgt, results, strict=True):
        logits = model(torch.tensor([s]), torch.tensor([[BOS_ID, *t]]))  # (1, T, V)
        ref = F.log_softmax(logits[0], -1).gather(1, torch.tensor([*t, EOS_ID])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), ref, atol=1e-4, rtol=0)


def test_unrepresentable_models_are_refused_with_one_line(ckpt, tmp_path):
    tokenizer = load_model(ckpt).tokenizer
    path = _random_variant(
        tmp_path,
        tokenizer,
        attention={"encoder_self": "local", "encoder_self_options": {"window": 4}},
    )
    with pytest.raises(ExportError, match=r"encoder_self=local is an approximate attention") as err:
        export_model(path, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_export_user_errors(ckpt, export_dir, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^format=ct2 supports quantization none \| int8 \| int8_float32 \| int8_float16 \| float16 \| bfloat16, not 'int4'$",
    ):
        export_model(ckpt, tmp_path / "q", quantization="int4")
    with pytest.raises(ConfigError, match="already exists; pass force=true"):
        export_model(ckpt, export_dir)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(
        ConfigError, match="is not a litmt export; force=true only replaces exports"
    ):
        export_model(ckpt, tmp_path / "notes", force=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="is not a litmt CTranslate2 export"):
        CT2Translator(tmp_path)
    with pytest.raises(ConfigError, match="unknown engine 'tflite'"):
        load_translator(ckpt, engine="tflite")
    with pytest.raises(ConfigError, match="is a CTranslate2 export: decode it with engine=ct2"):
        load_translator(export_dir, engine="torch")
    with pytest.raises(ConfigError, match="engine=ct2 takes one checkpoint or export directory"):
        load_translator([ckpt, ckpt], engine="ct2")


def test_export_directory_contents_and_special_tokens(ckpt, export_dir):
    meta = read_metadata(export_dir)
    assert (meta["src_lang"], meta["tgt_lang"]) == ("en", "de")
    assert meta["checkpoint_sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert meta["decoding"] == {
        "beam_size": 5,
        "length_penalty": 1.0,
        "max_len_a": 1.2,
        "max_len_b": 10,
    }
    assert meta["quantization"] == "none"
    vocab = json.loads((export_dir / "shared_vocabulary.json").read_text())
    assert vocab[:4] == ["<blank>", "<unk>", "<s>", "</s>"]  # litmt pad, unk, bos, eos ids
    config = json.loads((export_dir / "config.json").read_text())
    assert config["decoder_start_token"] == "<s>" and not config["add_source_eos"]
    assert Tokenizer.load(export_dir).to_dict() == load_model(ckpt).tokenizer.to_dict()


def test_ct2_engine_converts_a_checkpoint_into_the_cache_once(ckpt, tmp_path):
    first = load_translator(ckpt, engine="ct2", cache_dir=tmp_path, threads=1)
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1 and (entries[0] / "model.bin").is_file()
    stamp = (entries[0] / "model.bin").stat().st_mtime_ns
    second = load_translator(ckpt, engine="ct2", cache_dir=tmp_path, threads=1)
    assert (entries[0] / "model.bin").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert first.translate(["A red dog runs."]) == second.translate(["A red dog runs."])


def test_ct2_cache_follows_a_checkpoint_retrained_in_place(ckpt, tmp_path):
    """A new last.ckpt written at the same path, with the same size and the old mtime, is
    converted again: the cache entry is named by the file's content, not its path or stat."""
    cache = tmp_path / "cache"
    last = other_weights(ckpt, tmp_path / "last.ckpt", seed=1)
    first = load_translator(last, engine="ct2", cache_dir=cache, threads=1)
    before = last.stat()
    other_weights(ckpt, last, seed=2)  # retrained in place: other weights, same layout
    os.utime(last, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = last.stat()  # only the bytes tell the two checkpoints apart
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = load_translator(last, engine="ct2", cache_dir=cache, threads=1)
    fresh = CT2Translator(export_model(last, tmp_path / "fresh"), threads=1)
    ids = [fresh.prepare(s) for s in held_sentences()[:8]]
    expected = fresh.search_ids(ids, beam_size=2)
    assert second.search_ids(ids, beam_size=2) == expected  # the new weights are served
    assert first.search_ids(ids, beam_size=2) != expected  # and the check can tell them apart
    model_bin = (fresh.model_dir / "model.bin").read_bytes()
    assert (second.model_dir / "model.bin").read_bytes() == model_bin
    digest = hashlib.sha256(last.read_bytes()).hexdigest()
    assert read_metadata(second.model_dir)["checkpoint_sha256"] == digest
    assert second.model_dir != first.model_dir and len(list(cache.iterdir())) == 2  # a new entry


def test_export_script(ckpt, tmp_path):
    out = tmp_path / "int8"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export.py"), f"ckpt_path={ckpt}", f"out={out}",
         "quantization=int8", "decoding.beam_size=4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    assert read_metadata(out)["decoding"]["beam_size"] == 4
    again = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export.py"), f"ckpt_path={ckpt}", f"out={out}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: export directory {out} already exists; pass force=true to replace it"
    ]


def test_benchmark_engines_smoke(ckpt, tmp_path):
    en, de = corpus(seed=1)
    (tmp_path / "test.en").write_text("\n".join(en[:20]) + "\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("\n".join(de[:20]) + "\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_engines", "--smoke",
         "--ckpt", str(ckpt), "--src", str(tmp_path / "test.en"), "--ref", str(tmp_path / "test.de"),
         "--threads", "1", "--exports", str(tmp_path / "exports"), "--json", str(tmp_path / "r.json"),
         "--engines", "torch", "ct2 float32", "ct2 int8", "--beam", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table[1:]] == ["torch", "ct2 float32", "ct2 int8"]
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert all(r["sentences_per_s"] > 0 and 0 <= r["bleu"] <= 100 + 1e-6 for r in rows)
    assert rows[1]["bleu"] == pytest.approx(rows[0]["bleu"], abs=0.1)  # float32 ct2 = torch
    assert read_metadata(tmp_path / "exports" / "int8")["quantization"] == "int8"


@pytest.mark.parametrize(
    ("site", "backend", "options"),
    [
        ("decoder_self", "linear", {}),
        ("cross", "sparse", {}),
        ("encoder_self", "flex", {"window": 4}),
    ],
)
def test_every_approximate_kernel_is_refused(ckpt, tmp_path, site, backend, options):
    tokenizer = load_model(ckpt).tokenizer
    attention = {site: backend, f"{site}_options": options}
    path = _random_variant(tmp_path, tokenizer, attention=attention)
    with pytest.raises(ExportError, match=rf"model.attention.{site}={backend} is an approximate"):
        export_model(path, tmp_path / "out")


@pytest.mark.parametrize("name", ["rope", "learned positions"])
def test_incremental_decoding_of_position_variants_matches(ckpt, tmp_path, name):
    """Positions at every decode step (rotary offsets, learned rows) agree with litmt's cache."""
    path = _random_variant(tmp_path, load_model(ckpt).tokenizer, **VARIANTS[name])
    out = export_model(path, tmp_path / "ct2")
    torch_engine, ct2_engine = Translator.from_checkpoint(path, device="cpu"), CT2Translator(out)
    ids = [torch_engine.prepare(s) for s in held_sentences()[:20]]
    for options in (dict(beam_size=1), dict(beam_size=4, length_penalty=0.6)):
        ref = torch_engine.search_ids(ids, **options)
        got = ct2_engine.search_ids(ids, **options)
        assert [h[0].tokens for h in got] == [h[0].tokens for h in ref]


def test_ct2_only_options_on_the_torch_engine_are_logged(ckpt, tmp_path, caplog, monkeypatch):
    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    load_translator(ckpt, engine="torch", device="cpu")
    assert "ignored by engine=torch" not in caplog.text  # defaults: nothing to report
    assert threads == []  # threads=0: torch's own setting stays
    load_translator(
        ckpt, engine="torch", device="cpu", ct2_cache_dir=tmp_path, quantization="int8", threads=2
    )
    lines = [r.getMessage() for r in caplog.records if "ignored by engine=torch" in r.getMessage()]
    assert len(lines) == 1
    assert "ct2_cache_dir=" in lines[0] and "quantization=int8" in lines[0]
    # threads means the same on every engine (litmt.runtime.threads): torch's threads here
    assert "threads" not in lines[0] and threads == [2]


def test_threads_must_not_be_negative(ckpt):
    with pytest.raises(ConfigError, match="threads must be >= 0"):
        load_translator(ckpt, engine="torch", device="cpu", threads=-1)


def test_ct2_engine_decodes_with_the_exports_defaults(ckpt, tmp_path):
    out = export_model(ckpt, tmp_path / "short", decoding={"max_len_a": 0.0, "max_len_b": 2})
    ct2 = CT2Translator(out)
    assert (ct2.default_config.max_len_a, ct2.default_config.max_len_b) == (0.0, 2)
    assert ct2.default_config.beam_size == 5  # a key the export leaves null: litmt's default
    src = [ct2.prepare(s) for s in held_sentences()[:4]]
    assert max(len(h[0].tokens) for h in ct2.search_ids(src)) <= 2  # litmt.json's budget
    wider = ct2.search_ids(src, max_len_b=12)  # an explicit option wins
    assert max(len(h[0].tokens) for h in wider) > 2
    assert ct2.translate(["A dog."]) == ct2.translate(["A dog."], max_len_a=0.0, max_len_b=2)


def test_load_translator_chooses_the_engine(ckpt, export_dir):
    assert isinstance(load_translator(export_dir, engine="ct2"), CT2Translator)
    assert type(load_translator(ckpt, device="cpu")) is Translator


def _script(name: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *overrides],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_translate_and_evaluate_jobs_on_the_ct2_engine(ckpt, export_dir, tmp_path):
    en, de = corpus(seed=1)
    src, ref = tmp_path / "t.en", tmp_path / "t.de"
    src.write_text("\n".join(en[:30]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(de[:30]) + "\n", encoding="utf-8")
    common = [f"input={src}", "beam_size=3", "threads=1"]
    by_torch = _script("translate.py", f"ckpt_path={ckpt}", *common)
    by_ct2 = _script("translate.py", f"ckpt_path={export_dir}", "engine=ct2", *common)
    assert by_torch.returncode == 0 and by_ct2.returncode == 0, by_ct2.stderr
    assert len(by_ct2.stdout.splitlines()) == 30
    reference = Translator.from_checkpoint(ckpt, device="cpu")
    sources = [reference.prepare(x) for x in en[:30]]
    lines = [out.stdout.splitlines() for out in (by_torch, by_ct2)]
    assert_parity(reference, sources, *lines, beam_size=3)
    expected = corpus_bleu(by_ct2.stdout.splitlines(), de[:30])  # the same engine's output
    ev = _script(
        "evaluate.py", f"ckpt_path={export_dir}", "engine=ct2", f"src_file={src}",
        f"ref_file={ref}", "beam_size=3", "progress=false", "threads=1",
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    bleu = next(line for line in ev.stdout.splitlines() if line.startswith("BLEU"))
    assert float(bleu.split(" = ")[1].split()[0]) == pytest.approx(expected, abs=0.01)
    # a .ckpt on engine=ct2 is converted into ct2_cache once
    cached = _script(
        "translate.py", f"ckpt_path={ckpt}", "engine=ct2", f"ct2_cache={tmp_path / 'cache'}",
        'text=["A red dog runs."]', "beam_size=3", "threads=1",
    )  # fmt: skip
    assert cached.returncode == 0, cached.stderr
    want = reference.translate(["A red dog runs."], beam_size=3)
    assert_parity(reference, [reference.prepare("A red dog runs.")],
                  want, cached.stdout.splitlines(), beam_size=3)  # fmt: skip
    assert len(list((tmp_path / "cache").iterdir())) == 1
    wrong = _script("translate.py", f"ckpt_path={export_dir}", 'text=["A dog."]')
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        f"error: {export_dir} is a CTranslate2 export: decode it with engine=ct2"
    ]
