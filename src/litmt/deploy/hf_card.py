"""The model card (``README.md``) of a ``format=hf`` export: languages, how the model was
trained (the run directory's Hydra overrides, when the checkpoint sits in one), test scores
(BLEU and chrF with their sacreBLEU signatures, when a test set is given), the litmt version."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from litmt.checkpoint.load import LoadedModel
from litmt.data.text import read_text_file
from litmt.decoding.translator import Translator
from litmt.metrics import corpus_scores


def _version() -> str:
    try:
        return metadata.version("litmt")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_info(ckpt: Path) -> tuple[str | None, str | None]:
    """(training command, data directory) from the Hydra files of the run `ckpt` belongs to
    (``<run>/checkpoints/x.ckpt`` next to ``<run>/.hydra``), or (None, None)."""
    for run in (ckpt.parent.parent, ckpt.parent):
        hydra = run / ".hydra"
        if (hydra / "overrides.yaml").is_file():
            from omegaconf import OmegaConf

            overrides = list(OmegaConf.load(hydra / "overrides.yaml"))
            command = "python scripts/train.py " + " ".join(str(o) for o in overrides)
            data = None
            if (hydra / "config.yaml").is_file():
                cfg = OmegaConf.load(hydra / "config.yaml")
                name = OmegaConf.select(cfg, "data.name", default=None)
                where = OmegaConf.select(cfg, "data.dir", default=None)
                data = f"{name} ({where})" if where else name
            return command, data
    return None, None


def test_scores(loaded: LoadedModel, src: str, ref: str, decoding: Mapping[str, Any]) -> list[str]:
    """sacreBLEU report lines (BLEU, chrF) of the model on a test set (the export's decoding)."""
    translator = Translator(loaded.model, loaded.tokenizer, device="cpu")
    hyps = translator.translate(read_text_file(src, "card.test_src"), **dict(decoding))
    refs = read_text_file(ref, "card.test_ref")
    results = corpus_scores(hyps, refs, metrics=("bleu", "chrf"))
    return [r.line for r in results.values()]


def write_model_card(
    out: Path,
    loaded: LoadedModel,
    paths: Sequence[str | Path],
    class_name: str,
    decoding: Mapping[str, Any],
    card: Mapping[str, Any],
) -> Path:
    """Write ``out/README.md``.

    Args:
        card: ``test_src``, ``test_ref`` (files: scored with the export's decoding
            defaults), ``test_name`` (how the card names that test set).
    """
    src, tgt = loaded.src_lang, loaded.tgt_lang
    command, data = run_info(Path(paths[0]))
    cfg = loaded.model.config
    lines = [
        "---",
        f"language: [{src}, {tgt}]",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [litmt, translation]",
        "---",
        "",
        f"# litmt {src}-{tgt} ({class_name})",
        "",
        f"A Transformer translating {src} to {tgt}, trained with litmt {_version()} and "
        "exported with `scripts/export.py format=hf`. It loads with transformers alone:",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("PATH/TO/THIS/DIRECTORY")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("PATH/TO/THIS/DIRECTORY")',
        'out = model.generate(**tok(["..."], return_tensors="pt"))',
        "print(tok.batch_decode(out, skip_special_tokens=True))",
        '# transformers 4.x also: pipeline("translation", model="PATH/TO/THIS/DIRECTORY")',
        "```",
        "",
        f"- Languages: source `{src}`, target `{tgt}`.",
        f"- Model: d_model={cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, "
        f"{cfg.n_heads} heads, FFN {cfg.d_ff}, {cfg.activation}, "
        f"{'pre' if cfg.norm_first else 'post'}-norm, vocabulary {cfg.tgt_vocab_size}.",
        f"- Checkpoint(s): {', '.join(Path(p).name for p in paths)}.",
        f"- Training data: {data or 'not recorded with the checkpoint'}.",
        f"- Training command: `{command}`" if command else "- Training command: not recorded.",
        f"- Generation defaults: beam {decoding['beam_size']}, length_penalty "
        f"{decoding['length_penalty']} (litmt ranks beams with GNMT's ((5 + n) / 6) ** alpha, "
        "transformers with n ** alpha: the two agree at 0); litmt's output budget "
        f"{decoding['max_len_a']} * source tokens + {decoding['max_len_b']} is not expressible "
        "in a generation config, which caps outputs at max_positions instead.",
        "",
    ]
    if card.get("test_src") and card.get("test_ref"):
        name = card.get("test_name") or Path(str(card["test_src"])).name
        lines += [f"## Scores on {name}", "", "```"]
        lines += test_scores(loaded, str(card["test_src"]), str(card["test_ref"]), decoding)
        lines += ["```", ""]
    path = out / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
