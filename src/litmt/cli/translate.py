"""The translate command: `python scripts/translate.py ckpt_path=model.ckpt [overrides]` (conf/translate.yaml)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from litmt.checkpoint.paths import checkpoint_paths
from litmt.data.text import open_output, read_lines
from litmt.decoding.alignment import AlignConfig
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator import Aligned, NBest
from litmt.deploy.engines import engine_options, load_translator
from litmt.errors import ConfigError, DataError


def format_result(
    result: str | NBest | Aligned, index: int, n_best: int, scores: bool
) -> list[str]:
    """Output lines for one input line.

    - ``n_best == 1``: ``hypothesis``, or ``score<TAB>hypothesis`` with `scores`.
    - ``n_best > 1``: exactly `n_best` lines ``index<TAB>score<TAB>hypothesis`` (index =
      0-based input line), best first; missing hypotheses (empty input) are padded with
      empty text and score ``-inf``.
    - With alignments (`Aligned` results): each line ends with ``<TAB>alignment``
      (Pharaoh ``0-0 1-2 ...``, source word - target word).
    """
    if isinstance(result, str):
        return [result]
    aligned = bool(result) and len(result[0]) == 3
    pad = ("", float("-inf"), "") if aligned else ("", float("-inf"))
    entries: list[tuple] = [*result, *[pad] * (n_best - len(result))]
    lines = []
    for text, score, *alignment in entries[:n_best]:
        cols = [str(index)] if n_best > 1 else []
        cols += [f"{score:.4f}"] if scores else []
        lines.append("\t".join([*cols, text, *alignment]))
    return lines


def _sentences_from_cfg(text: Any) -> list[str]:
    if isinstance(text, str):
        return [text]
    if isinstance(text, ListConfig | list | tuple):
        return [str(t) for t in text]
    raise ConfigError(f"text must be a sentence or a list of sentences, got {type(text).__name__}")


def translate(cfg: DictConfig) -> int:
    """Translate `text=[...]`, `input=FILE` or stdin to `output=FILE` or stdout.

    One output line per input line (`n_best` lines with n_best > 1); see `format_result`.

    Returns:
        Number of input lines translated.
    """
    ckpt = checkpoint_paths(
        cfg.get("ckpt_path"), run_dir=cfg.get("run_dir"), average_last=cfg.get("average_last")
    )
    text, input_path, output_path = cfg.get("text"), cfg.get("input"), cfg.get("output")
    if text is not None and input_path is not None:
        raise ConfigError("give either text=[...] or input=FILE, not both")
    if input_path is not None and not Path(str(input_path)).is_file():
        raise DataError(f"input file not found: {input_path}")
    translator = load_translator(ckpt, **engine_options(cfg))
    # null keys: the translator's defaults (an export's litmt.json ones on engine=ct2)
    config = DecodeConfig.from_options(cfg.decoding, base=translator.default_config)
    n_best, scores = config.n_best, bool(cfg.scores) or config.n_best > 1
    options: dict[str, Any] = dict(config=config, return_scores=scores)
    if cfg.get("print_alignment"):
        heads = cfg.get("alignment_heads")
        options["alignment"] = AlignConfig(
            layer=int(cfg.get("alignment_layer", -1)),
            heads=None if heads is None else tuple(int(h) for h in heads),
        )
    chunk_lines = int(cfg.chunk_lines)
    with ExitStack() as stack:
        lines: Iterable[str]
        if text is not None:
            lines = _sentences_from_cfg(text)
        elif input_path is not None:
            raw = stack.enter_context(Path(str(input_path)).open("rb"))
            lines = read_lines(raw, str(input_path))
        else:
            lines = read_lines(sys.stdin.buffer, "stdin")
            chunk_lines = 1 if sys.stdin.isatty() else chunk_lines
        out = stack.enter_context(open_output(None if output_path is None else str(output_path)))
        count = 0
        results = translator.translate_stream(
            lines, chunk_lines=chunk_lines, max_tokens=int(cfg.max_tokens), **options
        )
        for i, result in enumerate(results):
            out.write("\n".join(format_result(result, i, n_best, scores)) + "\n")
            count += 1
            if output_path is None:
                out.flush()  # stream: each translation appears as soon as it is ready
    return count
