"""Score a checkpoint (or an average of several) with sacreBLEU: the `evaluate(cfg)` job.

Checkpoints: ``ckpt_path=A.ckpt``, ``ckpt_path=[A.ckpt,B.ckpt]`` (weights averaged), or
``run_dir=DIR average_last=N`` (the N most recent checkpoints of a run, see
`select_last_checkpoints`). Data: ``src_file=... ref_file=...`` (plain text, one sentence a
line), or ``data=<config> split=test`` (any `conf/data` corpus; its raw text is read, no
tokenizer is trained). The same module holds the `average_checkpoints.py` job.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from litmt.checkpoint import load_model, save_model_checkpoint
from litmt.errors import ConfigError, DataError
from litmt.metrics import corpus_scores
from litmt.translate import Translator

log = logging.getLogger("litmt.evaluate")

_STEP = re.compile(r"step=(\d+)")


# -- checkpoints -------------------------------------------------------------------------
def select_last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The `n` most recent checkpoints under `run_dir` (searched recursively), oldest first.

    ``last*.ckpt`` (a copy of the newest) and ``avg*``/``average*`` files (earlier averages)
    are skipped. "Recent" is the training step in a ``step=N`` file name (Lightning's
    default ``epoch=E-step=N.ckpt``) when every file has one, else the modification time.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"run_dir={root} is not a directory")
    if n < 1:
        raise ConfigError(f"average_last must be at least 1, got {n}")
    files = [
        p
        for p in root.rglob("*.ckpt")
        if not p.name.startswith(("last", "avg", "average")) and p.is_file()
    ]
    if len(files) < n:
        raise ConfigError(
            f"average_last={n} but {root} holds {len(files)} checkpoint(s) "
            "(excluding last*.ckpt and avg*.ckpt)"
        )
    steps = [_STEP.search(p.name) for p in files]
    if all(steps):
        files = [p for _, p in sorted(zip((int(m[1]) for m in steps), files, strict=True))]
    else:
        files.sort(key=lambda p: (p.stat().st_mtime, p.name))
    return files[-n:]


def checkpoint_paths(cfg: DictConfig) -> list[str]:
    """Checkpoints named by ``ckpt_path`` (a path or list) or ``run_dir`` + ``average_last``."""
    ckpt = cfg.get("ckpt_path")
    average_last = cfg.get("average_last")
    if ckpt and average_last:
        raise ConfigError("give either ckpt_path=... or run_dir=DIR average_last=N, not both")
    if average_last:
        if not cfg.get("run_dir"):
            raise ConfigError("average_last=N needs run_dir=<the run's directory>")
        return [str(p) for p in select_last_checkpoints(cfg.run_dir, int(average_last))]
    if not ckpt:
        raise ConfigError(
            "no checkpoint given: pass ckpt_path=<.ckpt> (or a list), or run_dir=DIR average_last=N"
        )
    return [str(p) for p in ckpt] if isinstance(ckpt, ListConfig | list) else [str(ckpt)]


def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> Path:
    """Average the weights of `paths` (one run) into a self-contained checkpoint `output`."""
    loaded = load_model(list(paths), map_location="cpu")
    return save_model_checkpoint(
        output,
        loaded.model,
        loaded.tokenizer,
        loaded.src_lang,
        loaded.tgt_lang,
        extra={"averaged_from": [str(p) for p in paths]},
    )


def average(cfg: DictConfig) -> Path:
    """The `scripts/average_checkpoints.py` job: ``inputs=[...]`` or ``run_dir`` + ``average_last``."""
    if not cfg.get("output"):
        raise ConfigError("no output given: pass output=<path of the averaged .ckpt>")
    inputs = cfg.get("inputs")
    if inputs and cfg.get("average_last"):
        raise ConfigError("give either inputs=[...] or run_dir=DIR average_last=N, not both")
    if inputs:
        paths = [str(p) for p in inputs] if isinstance(inputs, ListConfig | list) else [str(inputs)]
    elif cfg.get("average_last"):
        paths = checkpoint_paths(cfg)
    else:
        raise ConfigError(
            "nothing to average: pass inputs=[a.ckpt,b.ckpt] or run_dir=DIR average_last=N"
        )
    out = average_checkpoints(paths, cfg.output)
    log.info("averaged %d checkpoint(s) → %s", len(paths), out)
    return out


# -- data --------------------------------------------------------------------------------
def read_text(path: str | Path, what: str) -> list[str]:
    """Lines of a UTF-8 text file (invalid bytes replaced; only "\\n" ends a line)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} not found: {p}")
    with p.open("r", encoding="utf-8-sig", errors="replace", newline="\n") as f:
        return [line.removesuffix("\n").removesuffix("\r") for line in f]


def load_eval_data(cfg: DictConfig) -> tuple[list[str], list[str], str]:
    """(sources, references, description) from src_file/ref_file or data + split."""
    if cfg.get("src_file") or cfg.get("ref_file"):
        if cfg.get("data") is not None:
            raise ConfigError("give either src_file/ref_file or data=<config>, not both")
        if not (cfg.get("src_file") and cfg.get("ref_file")):
            raise ConfigError("src_file and ref_file go together: pass both")
        src = read_text(cfg.src_file, "src_file")
        ref = read_text(cfg.ref_file, "ref_file")
        if len(src) != len(ref):
            raise DataError(
                f"src_file has {len(src)} lines but ref_file has {len(ref)}; "
                "they must align line by line"
            )
        return src, ref, f"{cfg.src_file} / {cfg.ref_file}"
    if cfg.get("data") is None:
        raise ConfigError(
            "no evaluation data: pass src_file=... ref_file=..., or data=<config> split=test"
        )
    from hydra.utils import instantiate  # only this path needs Hydra and the datamodule

    datamodule = instantiate(cfg.data)
    split = str(cfg.get("split") or "test")
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
    paths = checkpoint_paths(cfg)
    sources, references, label = load_eval_data(cfg)
    translator = Translator.from_checkpoint(
        paths,
        device=cfg.get("device"),
        attention=cfg.get("attention"),
    )
    data_cfg = cfg.get("data")
    if data_cfg is not None and (
        data_cfg.get("src_lang") != translator.src_lang
        or data_cfg.get("tgt_lang") != translator.tgt_lang
    ):
        log.warning(
            "the checkpoint translates %s→%s but the data is %s→%s",
            translator.src_lang,
            translator.tgt_lang,
            data_cfg.get("src_lang"),
            data_cfg.get("tgt_lang"),
        )
    decoding = {
        "beam_size": int(cfg.beam_size),
        "length_penalty": float(cfg.length_penalty),
        "max_len_a": float(cfg.max_len_a),
        "max_len_b": int(cfg.max_len_b),
        "min_len": int(cfg.get("min_len", 0)),
    }
    log.info(
        "decoding %d sentences (%s) with %s on %s",
        len(sources),
        label,
        paths[0] if len(paths) == 1 else f"the average of {len(paths)} checkpoints",
        translator.device,
    )
    t0 = time.perf_counter()
    hyps = translator.translate(
        sources, max_tokens=int(cfg.max_tokens), progress=bool(cfg.progress), **decoding
    )
    seconds = time.perf_counter() - t0
    assert all(isinstance(h, str) for h in hyps)
    if cfg.get("hyp_file"):
        hyp_path = Path(str(cfg.hyp_file))
        hyp_path.parent.mkdir(parents=True, exist_ok=True)
        hyp_path.write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    results = corpus_scores(hyps, references)  # type: ignore[arg-type]
    for result in results.values():
        print(result.line, flush=True)
    log.info(
        "%d sentences in %.1fs (%.1f sent/s)",
        len(sources),
        seconds,
        len(sources) / max(seconds, 1e-9),
    )
    if cfg.get("scores_file"):
        report: dict[str, Any] = {
            "checkpoints": paths,
            "data": label,
            "n_sentences": len(sources),
            "decoding": decoding,
            "decode_seconds": round(seconds, 3),
            "hyp_file": str(cfg.hyp_file) if cfg.get("hyp_file") else None,
            "scores": {key: r.to_dict() for key, r in results.items()},
        }
        scores_path = Path(str(cfg.scores_file))
        scores_path.parent.mkdir(parents=True, exist_ok=True)
        scores_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return {key: r.score for key, r in results.items()}


__all__ = [
    "average",
    "average_checkpoints",
    "checkpoint_paths",
    "evaluate",
    "load_eval_data",
    "select_last_checkpoints",
]
