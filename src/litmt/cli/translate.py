"""The translate command: `python scripts/translate.py ckpt_path=model.ckpt [overrides]` (conf/translate.yaml).

``input=FILE.jsonl`` (the name ends with ``.jsonl``) reads one JSON object per line,
``{"src": "A dog runs.", "prefix": "Ein Hund", "constraints": ["rennt"]}``, ``prefix`` and
``constraints`` optional (`litmt.decoding.steering`), and writes one JSON object per line
(`jsonl_result`): ``{"translation": ..., "constraints_met": true}``. A line whose constraints
could not all be met within the output budget gets its best translation with
``"constraints_met": false``, and the run one warning line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from omegaconf import DictConfig, ListConfig

from litmt.config import job_config, renamed_keys
from litmt.data.text import open_output, read_lines
from litmt.decoding.analysis.alignment import AlignConfig
from litmt.decoding.config import DecodeConfig, job_options
from litmt.decoding.translator import Aligned, NBest, Translation
from litmt.deploy.loader import LoadConfig
from litmt.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# translate.yaml keys that changed their name: the old spelling works for one release.
RENAMES = {"scores": "return_scores"}


@dataclass(frozen=True)
class TranslateConfig:
    """The translate command's own keys (conf/translate.yaml's top level; what to load and how
    to decode are the load, engine and decoding groups')."""

    text: str | list[str] | None = None
    """sentences given on the command line: a string or a list of strings"""
    input: str | None = None
    """read sentences from this file (UTF-8, one per line); null = stdin (or text); a name
    ending in .jsonl: one {"src", "prefix", "constraints"} object per line (prefix and
    constraints optional)"""
    output: str | None = None
    """write translations to this file; null = stdout"""
    max_tokens: int = 4096
    """padded source tokens per decoding batch"""
    chunk_lines: int = 256
    """lines read before decoding a chunk (an interactive terminal uses 1)"""
    return_scores: bool = False
    """prefix each line with the length-normalised log-prob score and a tab (as
    Translator.translate's return_scores)"""
    print_alignment: bool = False
    """append "<TAB>0-0 1-2 ..." (source word - target word) from cross-attention"""
    alignment_layer: int = -1
    """decoder layer whose cross-attention aligns (-1 = last, -2 = penultimate)"""
    alignment_heads: list[int] | None = None
    """list of heads to average, e.g. [0,1]; null = all heads"""

    def __post_init__(self) -> None:
        if self.text is not None and self.input is not None:
            raise ConfigError("give either text=[...] or input=FILE, not both")
        if int(self.chunk_lines) < 1:
            raise ConfigError(f"chunk_lines must be at least 1, got {self.chunk_lines}")

    @classmethod
    def from_cfg(cls, cfg: Any) -> TranslateConfig:
        """The fields from the composed translate config (the other keys are the groups');
        ``scores`` is the old name of ``return_scores`` (`wants_scores`).

        Raises:
            ConfigError: a field set to null that needs a value, or a bad value.
        """
        settings = job_config(cls, cfg, "translate")
        return dataclasses.replace(settings, return_scores=wants_scores(cfg))


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


def jsonl_result(found: list[Translation], n_best: int, return_scores: bool) -> str:
    """The output line of one ``input=FILE.jsonl`` line: ``{"translation": text,
    "constraints_met": bool}`` (+ ``"score"`` with `return_scores`, + ``"alignment"`` when
    asked for); with ``n_best > 1``, ``{"n_best": [...]}`` of such objects, best first (each
    with its score; fewer than `n_best` where the search finished fewer)."""

    def entry(t: Translation, score: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"translation": t.text, "constraints_met": t.constraints_met}
        if score:
            out["score"] = round(t.score, 4)
        if t.alignment:
            out["alignment"] = t.alignment
        return out

    if n_best == 1:
        return json.dumps(entry(found[0], return_scores), ensure_ascii=False)
    return json.dumps({"n_best": [entry(t, True) for t in found]}, ensure_ascii=False)


def translate_jsonl(
    translator: Any,
    lines: Iterable[str],
    name: str,
    chunk_lines: int,
    max_tokens: int,
    **options: Any,
) -> Iterator[list[Translation]]:
    """Translate ``input=FILE.jsonl`` records in chunks of `chunk_lines`, one result per line
    (`litmt.decoding.translator_base.BaseTranslator.translations`)."""
    chunk: list[tuple[str, Any, Any]] = []
    first = 1
    options.pop("return_scores", None)  # the output line carries the scores it needs

    def run() -> list[list[Translation]]:
        where = (
            f"{name} line {first}"
            if len(chunk) == 1
            else f"{name} lines {first}-{first + len(chunk) - 1}"
        )
        try:
            return translator.translations(
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


def write_jsonl(
    found: Iterable[list[Translation]], out: TextIO, name: str, n_best: int, scores: bool
) -> int:
    """Write the results of ``input=FILE.jsonl`` records to `out` (`jsonl_result`), each as
    soon as it is ready, with one warning line at the end when some could not meet their
    constraints; the number of lines."""
    count = missed = 0
    for row in found:
        out.write(jsonl_result(row, n_best, scores) + "\n")
        out.flush()
        count += 1
        missed += not row[0].constraints_met
    if missed:
        log.warning(
            "%s: %d of %d line(s) could not meet all their constraints within the output "
            'budget; their best translations are marked "constraints_met": false',
            name,
            missed,
            count,
        )
    return count


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
    settings = TranslateConfig.from_cfg(cfg)
    load = LoadConfig.from_cfg(cfg, "translate")
    text, input_path, output_path = settings.text, settings.input, settings.output
    if input_path is not None and not Path(str(input_path)).is_file():
        raise DataError(f"input file not found: {input_path}")
    translator = load.translator(cfg)
    # keys left at DecodeConfig's default: the translator's (an export's litmt.json ones)
    config = DecodeConfig.from_options(job_options(cfg.decoding), base=translator.default_config)
    n_best, scores = config.n_best, settings.return_scores or config.n_best > 1
    direction = load.direction()
    route = translator.route(**direction)  # an unknown direction fails before any input is read
    if route.zero_shot:
        print(f"note: {route.src_lang}-{route.tgt_lang} is zero-shot", file=sys.stderr)
    options: dict[str, Any] = dict(config=config, return_scores=scores, **direction)
    if settings.print_alignment:
        heads = settings.alignment_heads
        options["alignment"] = AlignConfig(
            layer=int(settings.alignment_layer),
            heads=None if heads is None else tuple(int(h) for h in heads),
        )
    chunk_lines = int(settings.chunk_lines)
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
            name = str(input_path)
            found = translate_jsonl(
                translator, lines, name, chunk_lines, int(settings.max_tokens), **options
            )
            return write_jsonl(found, out, name, n_best, scores)
        results = translator.translate_stream(
            lines, chunk_lines=chunk_lines, max_tokens=int(settings.max_tokens), **options
        )
        for i, result in enumerate(results):
            out.write("\n".join(format_result(result, i, n_best, scores)) + "\n")
            count += 1
            if output_path is None:
                out.flush()  # stream: each translation appears as soon as it is ready
    return count
