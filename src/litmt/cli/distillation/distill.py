"""The distill command: `python scripts/distill.py ckpt_path=teacher.ckpt data.dir=DIR out=DIR_KD`
(conf/distill.yaml).

Translates the training split of a ``conf/data`` corpus with a teacher and writes the
distilled corpus ``{out}/train.{src_lang,tgt_lang}`` with its provenance ``distill.json``
(`litmt.decoding.distill`: chunks, resume, the hypothesis kept, filters). The teacher is what
the load group names (``ckpt_path``: a .ckpt, a CTranslate2 export directory, a list of
checkpoints whose weights are averaged, or with ``engine=torch ensemble=true`` a list decoded
as an ensemble); by default it decodes on the ct2 engine in int8 with beam 5. With
``select=closest`` it decodes the n-best (``n_best=N``) and keeps, per line, the hypothesis
closest to the reference (Seq-Inter).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litmt.checkpoint.io import weights_digest
from litmt.config import build, plain
from litmt.data.config import DataConfig, resolve_path
from litmt.data.corpora.parallel import ParallelCorpus
from litmt.data.corpora.streams import count_pairs, pair_chunks
from litmt.decoding.config import DecodeConfig, job_options
from litmt.decoding.distill import (
    FORMAT,
    Candidate,
    DistillConfig,
    DistillOutput,
    Translate,
    distill_corpus,
    log_counts,
)
from litmt.deploy.export.base import file_sha256
from litmt.deploy.export.ct2 import is_export_dir, read_metadata
from litmt.deploy.loader import LoadConfig, engine_options, load_translator
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


def teacher_identity(paths: list[str], load: LoadConfig, engine: str) -> dict[str, Any]:
    """What the teacher is: each checkpoint's weights digest (an export: its model.bin's
    sha256 and the source checkpoint's), and how several are combined.

    Raises:
        ConfigError: several checkpoints on engine=ct2 (it decodes one model).
        CheckpointError: a missing or unreadable checkpoint.
    """
    if len(paths) > 1 and engine == "ct2":
        raise ConfigError(
            "engine=ct2 decodes one teacher; for an ensemble teacher pass engine=torch "
            "ensemble=true (CTranslate2 does not ensemble), or average the checkpoints first "
            "(scripts/average_checkpoints.py)"
        )
    models = []
    for path in paths:
        if is_export_dir(path):
            meta = read_metadata(path)
            models.append(
                {
                    "path": str(path),
                    "model_bin_sha256": file_sha256(Path(path) / "model.bin"),
                    "checkpoint_sha256": meta.get("checkpoint_sha256"),
                }
            )
        else:
            models.append({"path": str(path), "weights_sha256": weights_digest(path)})
    combine = "single" if len(paths) == 1 else "ensemble" if load.ensemble else "average"
    return {"models": models, "combine": combine}


def source_corpus(cfg: DictConfig) -> tuple[DataConfig, ParallelCorpus]:
    """The data group's settings and its main corpus (only its training split is read).

    Raises:
        ConfigError: no data group, or extra_train / directions (not distilled here).
    """
    if cfg.get("data") is None:
        raise ConfigError("no corpus: pass data.dir=DIR (local files) or data=<config>")
    settings = {k: v for k, v in plain(cfg.data).items() if k != "_target_"}
    data = DataConfig.from_kwargs(settings)
    if data.extra_train or data.directions:
        raise ConfigError(
            "distill translates one corpus's training split: drop data.extra_train and "
            "data.directions (distil each corpus on its own)"
        )
    corpus = ParallelCorpus(
        src_lang=data.src_lang, tgt_lang=data.tgt_lang,
        dir=resolve_path(data.dir) if data.dir is not None else None, format=data.format,
        splits=dataclasses.asdict(data.splits), hub=data.hub.spec(), layout=data.layout,
        columns=data.columns, translation_column=data.translation_column,
        hf_cache_dir=str(resolve_path(data.cache_dir) / "hf"),
    )  # fmt: skip
    return data, corpus


def settings_key(
    teacher: dict[str, Any],
    engine: dict[str, Any],
    translator: Any,
    config: DecodeConfig,
    direction: dict[str, Any],
    corpus: ParallelCorpus,
    data: DataConfig,
    settings: DistillConfig,
) -> dict[str, Any]:
    """Everything that decides the distilled corpus: a resumed run must match it (paths may
    move; weights, decoding, source files and filters may not)."""
    key: dict[str, Any] = {
        "teacher": [{k: v for k, v in m.items() if k != "path"} for m in teacher["models"]],
        "combine": teacher["combine"],
        "engine": {k: engine[k] for k in ("engine", "compute_type", "quantization")},
        "device": str(translator.device),
        "decoding": dataclasses.asdict(config),
        "direction": direction,
        "source": {"fingerprint": corpus.fingerprint("train"), "limit": data.limit},
        "filters": {"max_ratio": settings.max_ratio, "drop_copies": settings.drop_copies},
        "chunk_lines": settings.chunk_lines,
        "max_tokens": settings.max_tokens,
    }
    # recorded when set: a corpus distilled before these settings existed keeps its key
    if settings.select != "top":
        key["select"] = settings.select
    if settings.filter_ce_quantile is not None:
        key["filters"]["ce_quantile"] = settings.filter_ce_quantile
    return json.loads(json.dumps(key))  # as the marker reads it back (lists, not tuples)


def chunk_translator(
    translator: Any, config: DecodeConfig, direction: dict[str, Any], max_tokens: int
) -> Translate:
    """Source lines -> (per line the teacher's n-best as `Candidate`s, best first, per line its
    source subword tokens); a candidate's cross-entropy is the decode's own log-probability
    per token (eos counted), on every engine."""

    def translate(sources: list[str]) -> tuple[list[list[Candidate]], list[int]]:
        found = translator.translations(sources, config, max_tokens=max_tokens, **direction)
        tok = translator.tokenizer
        lengths = iter(len(i) for i in tok.encode_tgt([t.text for row in found for t in row]))
        candidates = [
            [Candidate(t.text, next(lengths), -t.log_prob / (t.length + 1)) for t in row]
            for row in found
        ]
        return candidates, [len(i) for i in tok.encode_src(sources)]

    return translate


def check_select(config: DecodeConfig, settings: DistillConfig) -> None:
    """The decoding fits the hypothesis kept: one (``select=top``) or an n-best to choose from
    (``select=closest``); never sampling.

    Raises:
        ConfigError: sampling, an n-best with select=top, a single hypothesis with closest.
    """
    if config.method == "sample":
        raise ConfigError("distill keeps the teacher's search output: use method=beam or greedy")
    if settings.select == "top" and config.n_best != 1:
        raise ConfigError(
            "distill keeps one translation per line: n_best=1, or select=closest to keep the "
            "hypothesis of the n-best closest to the reference"
        )
    if settings.select == "closest" and config.n_best < 2:
        raise ConfigError(
            "select=closest chooses among the teacher's n-best: pass n_best=N (2 or more, at "
            "most beam_size)"
        )


def load_teacher(cfg: DictConfig, load: LoadConfig) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(translator, teacher identity, engine options) of the load and engine groups; on
    engine=torch the ct2-only keys (compute_type, quantization) are not used."""
    engine = engine_options(cfg)
    if engine["engine"] == "torch":
        engine.update(compute_type="default", quantization="none")
    teacher = teacher_identity(load.paths(), load, engine["engine"])
    translator = load_translator(
        load.paths(),
        device=load.device,
        attention=load.attention,
        ensemble=bool(load.ensemble),
        **engine,
    )
    return translator, teacher, engine


def distill(cfg: DictConfig) -> dict[str, Any]:
    """Distil the training split of ``cfg.data`` into ``cfg.out`` (module docstring).

    Returns:
        The provenance written to ``{out}/distill.json`` (with ``counts``), or, when
        ``max_chunks`` stopped the run, ``{"finished": False, "counts": ...}``.
    """
    keys = [f.name for f in dataclasses.fields(DistillConfig)]
    settings = build(DistillConfig, {k: cfg[k] for k in keys if k in cfg}, "distill")
    if settings.out is None:
        raise ConfigError("give out=DIR, the directory of the distilled corpus")
    load = LoadConfig.from_cfg(cfg, "distill")
    data, corpus = source_corpus(cfg)
    out, langs = resolve_path(settings.out), (data.src_lang, data.tgt_lang)
    DistillOutput(out, langs, {}).refuse_foreign()  # before the teacher loads
    translator, teacher, engine = load_teacher(cfg, load)
    config = DecodeConfig.from_options(job_options(cfg.decoding), base=translator.default_config)
    check_select(config, settings)
    direction = load.direction()
    direction["src_lang"] = direction["src_lang"] or data.src_lang
    direction["tgt_lang"] = direction["tgt_lang"] or data.tgt_lang
    translator.route(**direction)  # an unknown direction fails before any decoding
    key = settings_key(teacher, engine, translator, config, direction, corpus, data, settings)
    output = DistillOutput(out, langs, key)
    done = output.finished()
    if done is not None:
        log.info("%s is already distilled with these settings; nothing to do", output.out)
        return done
    output.open_parts()
    translate = chunk_translator(translator, config, direction, int(settings.max_tokens))
    chunks = pair_chunks(corpus, [], "train", chunk=settings.chunk_lines, limit=data.limit)
    total = count_pairs(corpus, [], "train")
    total = min(total, data.limit) if total is not None and data.limit is not None else total
    if not distill_corpus(chunks, translate, output, settings, total):
        log_counts(output.counts, output.out)
        return {"finished": False, "counts": dataclasses.asdict(output.counts)}
    source = {
        "name": data.name,
        "dir": str(corpus.dir) if corpus.dir is not None else None,
        "hub": data.hub.path if corpus.dir is None else None,
        "format": data.format,
        "split": plain(data.splits.train),
    }
    provenance = {"format": FORMAT, "teacher": teacher, "source": source}
    done = output.finish(provenance, settings.filter_ce_quantile)
    log_counts(output.counts, output.out)
    return done


__all__ = [
    "check_select",
    "chunk_translator",
    "distill",
    "load_teacher",
    "settings_key",
    "source_corpus",
    "teacher_identity",
]
