"""The model card (``README.md``) of a ``format=hf`` export: languages, the transformers call
(for a multilingual model, one per direction: `litmt.deploy.export.hf.direction_calls`), how
the model was trained (the run directory's Hydra overrides, when the checkpoint sits in one),
test scores (BLEU and chrF with their sacreBLEU signatures, when a test set is given; a
multilingual model is scored on its first direction), the litmt version."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from litmt.checkpoint.io import languages_of
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
    """sacreBLEU report lines (BLEU, chrF) of the model on a test set (the export's decoding;
    ``src_lang`` -> ``tgt_lang``, a multilingual model's first direction)."""
    translator = Translator(
        loaded.model, loaded.tokenizer, device="cpu", languages=languages_of(loaded.meta),
        src_lang=loaded.src_lang, tgt_lang=loaded.tgt_lang,
    )  # fmt: skip
    texts = read_text_file(src, "card.test_src")
    hyps = translator.translate(texts, tgt_lang=loaded.tgt_lang, **dict(decoding))
    refs = read_text_file(ref, "card.test_ref")
    results = corpus_scores(hyps, refs, metrics=("bleu", "chrf"))
    return [r.line for r in results.values()]


def usage(directions: Mapping[str, tuple[str, str]]) -> list[str]:
    """The card's Python block: load, then one call (one per direction of a multilingual
    model, `directions` as `litmt.deploy.export.hf.direction_calls` gives them)."""
    lines = [
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("PATH/TO/THIS/DIRECTORY")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("PATH/TO/THIS/DIRECTORY")',
    ]
    if not directions:
        lines += [
            'out = model.generate(**tok(["..."], return_tensors="pt"))',
            "print(tok.batch_decode(out, skip_special_tokens=True))",
            '# transformers 4.x also: pipeline("translation", model="PATH/TO/THIS/DIRECTORY")',
        ]
    for name, (tag, placement) in directions.items():
        lines.append(f"# {name}")
        if placement == "target":
            lines += [
                'enc = tok(["..."], return_tensors="pt")',
                f'out = model.generate(**enc, forced_bos_token_id=tok.convert_tokens_to_ids("{tag}"))',
            ]  # fmt: skip
        else:
            lines.append(f'out = model.generate(**tok(["{tag} ..."], return_tensors="pt"))')
        lines.append("print(tok.batch_decode(out, skip_special_tokens=True))")
    return [*lines, "```"]


def write_model_card(
    out: Path,
    loaded: LoadedModel,
    paths: Sequence[str | Path],
    class_name: str,
    decoding: Mapping[str, Any],
    card: Mapping[str, Any],
    directions: Mapping[str, tuple[str, str]] | None = None,
) -> Path:
    """Write ``out/README.md``.

    Args:
        directions: a multilingual model's per-direction calls (`usage`); None = one pair.
        card: ``test_src``, ``test_ref`` (files: scored with the export's decoding
            defaults), ``test_name`` (how the card names that test set).
    """
    src, tgt = loaded.src_lang, loaded.tgt_lang
    directions = dict(directions or {})
    names = ", ".join(directions) or f"{src}-{tgt}"
    langs = list(dict.fromkeys(lang for n in directions for lang in n.split("-"))) or [src, tgt]
    command, data = run_info(Path(paths[0]))
    cfg = loaded.model.config
    lines = [
        "---",
        f"language: [{', '.join(langs)}]",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [litmt, translation]",
        "---",
        "",
        f"# litmt {names} ({class_name})",
        "",
        f"A Transformer translating {names}, trained with litmt {_version()} and "
        "exported with `scripts/export.py format=hf`. It loads with transformers alone"
        + (" (say the direction in every call, as below):" if directions else ":"),
        "",
        *usage(directions),
        "",
        f"- Languages: source `{src}`, target `{tgt}`."
        if not directions
        else f"- Directions: {names}; the language token of each is an added special token.",
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
        on = f" ({src}-{tgt})" if directions else ""
        lines += [f"## Scores on {name}{on}", "", "```"]
        lines += test_scores(loaded, str(card["test_src"]), str(card["test_ref"]), decoding)
        lines += ["```", ""]
    path = out / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
