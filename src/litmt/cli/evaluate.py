"""Score a checkpoint (or an average of several) with sacreBLEU: the `evaluate(cfg)` job.

Checkpoints: ``ckpt_path=A.ckpt``, ``ckpt_path=[A.ckpt,B.ckpt]`` (weights averaged), or
``run_dir=DIR average_last=N`` (the N most recent checkpoints of a run, see
`litmt.checkpoint.paths.select_last_checkpoints`). Data: ``src_file=... ref_file=...`` (plain text,
one sentence a line, read under `litmt.data.text.read_lines`'s policy), or ``data=<config> split=test`` (any `conf/data` corpus; its raw text is read, no
tokenizer is trained). The same module holds the `average_checkpoints.py` job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litmt.config import job_config
from litmt.data.text import read_text_file
from litmt.decoding.config import DecodeConfig, job_options
from litmt.deploy.loader import LoadConfig
from litmt.errors import ConfigError, DataError
from litmt.metrics import corpus_scores

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluateConfig:
    """The evaluate command's own keys (conf/evaluate.yaml's top level; the checkpoint, the
    corpus, the decoding and the engine are the load, data, decoding and engine groups')."""

    src_file: str | None = None
    """plain-text source, one sentence per line (with ref_file)"""
    ref_file: str | None = None
    """plain-text reference, aligned with src_file"""
    split: str = "test"
    """with data=...: train | valid | test"""
    max_tokens: int = 4096
    """padded source tokens per decoding batch"""
    hyp_file: str | None = None
    """write the hypotheses here (one per line, aligned with the source)"""
    scores_file: str | None = None
    """write a JSON report here (scores, signatures, checkpoints, decoding options)"""
    progress: bool = True
    """tqdm progress bar on stderr while decoding"""


# -- data --------------------------------------------------------------------------------
def load_eval_data(cfg: DictConfig) -> tuple[list[str], list[str], str]:
    """(sources, references, description) from src_file/ref_file or data + split."""
    settings = job_config(EvaluateConfig, cfg, "evaluate")
    if settings.src_file or settings.ref_file:
        if cfg.get("data") is not None:
            raise ConfigError("give either src_file/ref_file or data=<config>, not both")
        if not (settings.src_file and settings.ref_file):
            raise ConfigError("src_file and ref_file go together: pass both")
        src = read_text_file(settings.src_file, "src_file")
        ref = read_text_file(settings.ref_file, "ref_file")
        if len(src) != len(ref):
            raise DataError(
                f"src_file has {len(src)} lines but ref_file has {len(ref)}; "
                "they must align line by line"
            )
        return src, ref, f"{settings.src_file} / {settings.ref_file}"
    if cfg.get("data") is None:
        raise ConfigError(
            "no evaluation data: pass src_file=... ref_file=..., or data=<config> split=test"
        )
    from hydra.utils import instantiate  # only this path needs Hydra and the datamodule

    # one pair: src_lang/tgt_lang (a direction of a multilingual model) override the data's
    pair = {k: str(cfg[k]) for k in ("src_lang", "tgt_lang") if cfg.get(k)}
    datamodule = instantiate(cfg.data, **pair, directions=[])
    split = str(settings.split)
    corpus = datamodule.corpus.load(split)
    label = f"data={datamodule.name} split={split} ({datamodule.src_lang}→{datamodule.tgt_lang})"
    return list(corpus["src"]), list(corpus["tgt"]), label


# -- the job -----------------------------------------------------------------------------
def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Decode a test set and score it with sacreBLEU BLEU, chrF and TER.

    Prints one sacreBLEU line per metric (``BLEU|<signature> = 35.12 ...``) on stdout, writes
    the hypotheses to ``hyp_file`` and a JSON report to ``scores_file`` when given.

    Returns:
        {"bleu": ..., "chrf": ..., "ter": ...}
    """
    settings = job_config(EvaluateConfig, cfg, "evaluate")
    load = LoadConfig.from_cfg(cfg, "evaluate")
    paths = load.paths()
    sources, references, label = load_eval_data(cfg)
    translator = load.translator(cfg)
    direction = eval_direction(translator, load, cfg.get("data"))
    route = translator.route(**direction)  # an unknown direction fails before decoding
    # keys left at DecodeConfig's default: the translator's (an export's litmt.json ones)
    config = DecodeConfig.from_options(job_options(cfg.decoding), base=translator.default_config)
    log.info(
        "decoding %d sentences (%s) with %s on %s",
        len(sources),
        label,
        paths[0]
        if len(paths) == 1
        else f"the {'ensemble' if load.ensemble else 'average'} of {len(paths)} checkpoints",
        translator.device,
    )
    t0 = time.perf_counter()
    hyps = translator.translate(
        sources,
        config,
        max_tokens=int(settings.max_tokens),
        progress=bool(settings.progress),
        **direction,
    )
    seconds = time.perf_counter() - t0
    assert all(isinstance(h, str) for h in hyps)
    if settings.hyp_file:
        write_text(settings.hyp_file, "".join(f"{h}\n" for h in hyps))
    results = corpus_scores(hyps, references)  # type: ignore[arg-type]
    for result in results.values():
        print(result.line, flush=True)
    log.info(
        "%d sentences in %.1fs (%.1f sent/s)",
        len(sources),
        seconds,
        len(sources) / max(seconds, 1e-9),
    )
    if settings.scores_file:
        report: dict[str, Any] = {
            "checkpoints": paths,
            "data": label,
            "n_sentences": len(sources),
            "direction": f"{route.src_lang}-{route.tgt_lang}",
            "zero_shot": route.zero_shot,
            "decoding": dataclasses.asdict(config),
            "ensemble": bool(load.ensemble),
            "decode_seconds": round(seconds, 3),
            "hyp_file": str(settings.hyp_file) if settings.hyp_file else None,
            "scores": {key: r.to_dict() for key, r in results.items()},
        }
        write_text(settings.scores_file, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return {key: r.score for key, r in results.items()}


def eval_direction(translator: Any, load: LoadConfig, data_cfg: Any) -> dict[str, Any]:
    """The direction keywords to decode with: `load`'s, and on a multilingual model with
    ``data=...``, the data's pair where `load` names none. A one-pair model whose pair differs
    from the data's is decoded anyway, with a warning."""
    direction = load.direction()
    if data_cfg is None:
        return direction
    if translator.languages.multilingual:
        direction["src_lang"] = direction["src_lang"] or data_cfg.get("src_lang")
        direction["tgt_lang"] = direction["tgt_lang"] or data_cfg.get("tgt_lang")
    elif (data_cfg.get("src_lang"), data_cfg.get("tgt_lang")) != (
        translator.src_lang,
        translator.tgt_lang,
    ):
        log.warning(
            "the checkpoint translates %s→%s but the data is %s→%s",
            translator.src_lang,
            translator.tgt_lang,
            data_cfg.get("src_lang"),
            data_cfg.get("tgt_lang"),
        )
    return direction


def write_text(path: Any, text: str) -> None:
    """Write `text` to `path` (UTF-8), creating its parent directories."""
    out = Path(str(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")


__all__ = ["EvaluateConfig", "eval_direction", "evaluate", "load_eval_data"]
