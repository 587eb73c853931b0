"""The translate command: `python scripts/translate.py ckpt_path=model.ckpt [overrides]` (conf/translate.yaml).

``input=FILE.jsonl`` (the name ends with ``.jsonl``) reads one JSON object per line,
``{"src": "A dog runs.", "prefix": "Ein Hund", "constraints": ["rennt"]}``, ``prefix`` and
``constraints`` optional (`litmt.decoding.steering`); the output is as for a text file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from litmt.config import renamed_keys
from litmt.data.text import open_output, read_lines
from litmt.decoding.alignment import AlignConfig
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator import Aligned, NBest
from litmt.deploy.engines import LoadConfig
from litmt.errors import ConfigError, DataError

# translate.yaml keys that changed their name: the old spelling works for one release.
RENAMES = {"scores": "return_scores"}


def format_result(
    result: str | NBest | Aligned, index: int, n_best: int, return_scores: bool
) -> list[str]:
    """Output lines for one input line.

    - ``n_best == 1``: ``hypothesis``, or ``score<TAB>hypothesis`` with `return_scores`.
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
        cols += [f"{score:.4f}"] if return_scores else []
        lines.append("\t".join([*cols, text, *alignment]))
    return lines


def _sentences_from_cfg(text: Any) -> list[str]:
    if isinstance(text, str):
        return [text]
    if isinstance(text, ListConfig | list | tuple):
        return [str(t) for t in text]
    raise ConfigError(f"text must be a sentence or a list of sentences, got {type(text).__name__}")


JSONL_KEYS = ("src", "prefix", "constraints")


def jsonl_record(line: str, where: str) -> tuple[str, Any, Any]:
    """(src, prefix, constraints) of one ``input=FILE.jsonl`` line; absent fields are None.

    Raises:
        DataError: not a JSON object with a string ``src`` and no other keys than
            ``src``, ``prefix`` and ``constraints`` (the values are checked by
            `litmt.decoding.steering`, as `ConfigError`).
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(record, dict):
        raise DataError(f'{where}: expected a JSON object like {{"src": "..."}}')
    unknown = sorted(set(record) - set(JSONL_KEYS))
    if unknown:
        raise DataError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: src, prefix, constraints"
        )
    src = record.get("src")
    if not isinstance(src, str):
        raise DataError(f'{where}: "src" must be a string, got {type(src).__name__}')
    return src, record.get("prefix"), record.get("constraints")


def translate_jsonl(
    translator: Any,
    lines: Iterable[str],
    name: str,
    chunk_lines: int,
    max_tokens: int,
    **options: Any,
) -> Iterator[Any]:
    """Translate ``input=FILE.jsonl`` records in chunks of `chunk_lines`, one result per line."""
    chunk: list[tuple[str, Any, Any]] = []
    first = 1

    def run() -> list[Any]:
        where = (
            f"{name} line {first}"
            if len(chunk) == 1
            else f"{name} lines {first}-{first + len(chunk) - 1}"
        )
        try:
            return translator.translate(
                [c[0] for c in chunk],
                prefixes=[c[1] for c in chunk],
                constraints=[c[2] for c in chunk],
                max_tokens=max_tokens,
                first_line=first,
                **options,
            )
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    for number, line in enumerate(lines, start=1):
        chunk.append(jsonl_record(line, f"{name} line {number}"))
        if len(chunk) >= chunk_lines:
            yield from run()
            first += len(chunk)
            chunk = []
    if chunk:
        yield from run()


def wants_scores(cfg: DictConfig) -> bool:
    """``return_scores`` (or its old name ``scores``, with a deprecation line)."""
    given = {key: cfg.get(key) for key in ("scores", "return_scores")}
    given = {key: value for key, value in given.items() if value}  # false = null = the default
    return bool(renamed_keys(given, RENAMES, "translate").get("return_scores"))


def translate(cfg: DictConfig) -> int:
    """Translate `text=[...]`, `input=FILE` or stdin to `output=FILE` or stdout.

    One output line per input line (`n_best` lines with n_best > 1); see `format_result`.

    Returns:
        Number of input lines translated.
    """
    load = LoadConfig.from_cfg(cfg, "translate")
    text, input_path, output_path = cfg.get("text"), cfg.get("input"), cfg.get("output")
    if text is not None and input_path is not None:
        raise ConfigError("give either text=[...] or input=FILE, not both")
    if input_path is not None and not Path(str(input_path)).is_file():
        raise DataError(f"input file not found: {input_path}")
    translator = load.translator(cfg)
    # null keys: the translator's defaults (an export's litmt.json ones on engine=ct2)
    config = DecodeConfig.from_options(cfg.decoding, base=translator.default_config)
    n_best, scores = config.n_best, wants_scores(cfg) or config.n_best > 1
    direction = load.direction()
    route = translator.route(**direction)  # an unknown direction fails before any input is read
    if route.zero_shot:
        print(f"note: {route.src_lang}-{route.tgt_lang} is zero-shot", file=sys.stderr)
    options: dict[str, Any] = dict(config=config, return_scores=scores, **direction)
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
        if input_path is not None and str(input_path).endswith(".jsonl"):
            results: Iterable[Any] = translate_jsonl(
                translator, lines, str(input_path), chunk_lines, int(cfg.max_tokens), **options
            )
        else:
            results = translator.translate_stream(
                lines, chunk_lines=chunk_lines, max_tokens=int(cfg.max_tokens), **options
            )
        for i, result in enumerate(results):
            out.write("\n".join(format_result(result, i, n_best, scores)) + "\n")
            count += 1
            if output_path is None:
                out.flush()  # stream: each translation appears as soon as it is ready
    return count
