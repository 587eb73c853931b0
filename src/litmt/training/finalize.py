"""The end of a training run (`finalize` config): average the best checkpoints, choose the
beam size and length penalty on the valid split, score test, write ``scores.json``.

Order, so that test never influences a choice:

1. average the `average_best` checkpoints with the highest validation BLEU, each set of
   weights once (`best_checkpoints`; `litmt.checkpoint.average.average_checkpoints`) into
   ``<checkpoints>/avg_best{N}.ckpt``;
2. choose the model on **valid**: the average unless its greedy BLEU is below the best
   checkpoint's (an average that includes early checkpoints of a short run can be worse);
3. decode **valid** with every (beam size, length penalty) of the grid, using that model,
   and keep the point with the highest BLEU (ties: the first in grid order);
4. decode **test** with the best checkpoint and the average, each greedy and with the
   choice; the ``final`` score is the chosen model with the chosen decoding;
5. score the extra test sets (`data.extra_test`, e.g. ``test_2017_flickr``) with the chosen model
   and decodings; sets the data lack are skipped with a warning. They choose nothing.

Data come from the training datamodule's corpus (`ParallelCorpus.load`); decoding is
`Translator.translate`, BLEU and chrF `litmt.metrics.corpus_scores` (sacreBLEU), in
`bleu_on_split`; the report's text and metrics are `litmt.training.finalize_report`'s. A multilingual model (`data.directions`) is scored on every direction's
split (``bleu_en-fr``, ...); its ``bleu``/``chrf`` are the means over the directions, which
the valid choice maximises.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litmt.checkpoint.average import average_checkpoints
from litmt.checkpoint.io import weights_digest
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError, DataError
from litmt.metrics import corpus_scores
from litmt.records import is_record_id
from litmt.training.finalize_report import flat_metrics, summary_lines

log = logging.getLogger(__name__)

SCORES_FILE = "scores.json"
GREEDY = DecodeConfig(beam_size=1)  # beam 1 gives the greedy result (litmt.decoding.config)


@dataclass(frozen=True)
class Split:
    """One split's raw text: its name ("valid", "test"), sources and references."""

    name: str
    sources: list[str]
    references: list[str]
    src_lang: str | None = None  # a direction of a multilingual model (None: the one pair)
    tgt_lang: str | None = None

    def direction(self) -> dict[str, str]:
        """`Translator.translate`'s direction keywords ({} for the one pair)."""
        if self.src_lang is None or self.tgt_lang is None:
            return {}
        return {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang}


def check_finalize_config(cfg: DictConfig) -> None:
    """Fail before training (not an hour later) on a `finalize` block that cannot run.

    Raises:
        ConfigError: `average_best` is negative or above `model_checkpoint.save_top_k`, the
        grid has only one of its two lists, or `record` is not a record id.
    """
    fin = cfg.get("finalize")
    if not fin:
        return
    n = int(fin.get("average_best") or 0)
    if n < 0:
        raise ConfigError(f"finalize.average_best must be >= 0 (0 = off), got {n}")
    top_k = (cfg.get("callbacks") or {}).get("model_checkpoint", {}) or {}
    top_k = top_k.get("save_top_k")
    if n > 1 and top_k is not None and top_k != -1 and n > int(top_k):
        raise ConfigError(
            f"finalize.average_best={n} but callbacks.model_checkpoint.save_top_k={top_k} keeps "
            f"fewer checkpoints; set save_top_k >= {n}"
        )
    record = fin.get("record")
    if record is not None and not is_record_id(str(record)):
        raise ConfigError(f"finalize.record must be a snake_case record id, got {record!r}")
    beams, penalties = list(fin.get("beam_sizes") or []), list(fin.get("length_penalties") or [])
    if bool(beams) != bool(penalties):
        raise ConfigError(
            "finalize.beam_sizes and finalize.length_penalties go together: give both or neither"
        )


def best_checkpoints(best_k_models: Mapping[str, Any], n: int) -> list[str]:
    """The `n` existing checkpoints with the highest validation score, best first, each with
    other weights than the ones before it.

    A checkpoint whose weights equal a better-ranked one's (a run stopped by the clock could
    validate and save the same weights twice, one step apart; `StopAtTimeBudget` prevents it
    now) is skipped with a log line, so the average counts each set of weights once.

    Args:
        best_k_models: `ModelCheckpoint.best_k_models` ({path: monitored score}, mode max).
        n: how many.
    """
    ranked = sorted(best_k_models.items(), key=lambda kv: float(kv[1]), reverse=True)
    chosen: list[str] = []
    seen: dict[str, str] = {}  # weights digest -> the first checkpoint with those weights
    for path in (str(p) for p, _ in ranked if Path(p).is_file()):
        if len(chosen) == n:
            break
        digest = weights_digest(path)
        if digest in seen:
            log.info("finalize: %s has the weights of %s; counted once", path, seen[digest])
            continue
        seen[digest] = path
        chosen.append(path)
    return chosen


def bleu_on_split(
    translator: Translator, split: Split | Sequence[Split], config: DecodeConfig, max_tokens: int
) -> dict[str, float]:
    """Decode `split` with `config`: its sacreBLEU {"bleu": ..., "chrf": ...} (corpus metrics).

    Several splits (one per direction of a multilingual model): each direction's
    ``bleu_<src>-<tgt>`` and ``chrf_<src>-<tgt>``, and their means as ``bleu``/``chrf``.
    """
    if not isinstance(split, Split):
        per = {f"{s.src_lang}-{s.tgt_lang}": bleu_on_split(translator, s, config, max_tokens)
               for s in split}  # fmt: skip
        out = {m: sum(p[m] for p in per.values()) / len(per) for m in ("bleu", "chrf")}
        for name, p in per.items():
            out.update({f"bleu_{name}": p["bleu"], f"chrf_{name}": p["chrf"]})
        return out
    hyps = translator.translate(split.sources, config, max_tokens=max_tokens, **split.direction())
    results = corpus_scores(hyps, split.references, metrics=("bleu", "chrf"))  # type: ignore[arg-type]
    return {key: r.score for key, r in results.items()}


def choose_decoding(
    translator: Translator,
    valid: Split | Sequence[Split],
    beam_sizes: Sequence[int],
    length_penalties: Sequence[float],
    max_tokens: int,
    greedy: Mapping[str, float] | None = None,
) -> tuple[DecodeConfig, list[dict[str, Any]]]:
    """Decode `valid` at every (beam size, length penalty) and keep the highest BLEU.

    Beam size 1 (greedy) is decoded once, with the first length penalty: the penalty does
    not change a greedy output. `greedy`: this translator's greedy scores on `valid`, already
    computed (the model choice), reused instead of decoding again.

    Returns:
        (the chosen DecodeConfig, one {"beam_size", "length_penalty", "bleu", "chrf"} per point)
    """
    grid: list[dict[str, Any]] = []
    for beam, alpha in itertools.product(beam_sizes, length_penalties):
        if int(beam) == 1 and alpha != length_penalties[0]:
            continue  # greedy: the length penalty changes only the reported score, not the output
        config = DecodeConfig(beam_size=int(beam), length_penalty=float(alpha))
        if int(beam) == 1 and greedy is not None:
            metrics = dict(greedy)
        else:
            metrics = bleu_on_split(translator, valid, config, max_tokens)
        grid.append({"beam_size": int(beam), "length_penalty": float(alpha), **metrics})
        log.info("valid, beam %d, length penalty %.2f: BLEU %.2f", beam, alpha, metrics["bleu"])
    best = max(grid, key=lambda g: g["bleu"])  # max keeps the first of equal scores
    return DecodeConfig(beam_size=best["beam_size"], length_penalty=best["length_penalty"]), grid


def choose_model(
    translators: Mapping[str, Translator], valid: Split | Sequence[Split], max_tokens: int
) -> tuple[str, dict[str, dict[str, float]]]:
    """The model (``best`` or ``average``) to report: the higher greedy BLEU on `valid`.

    The average of the best checkpoints is usually better, but not always: averaged with
    checkpoints from early in training (a short run keeps few good ones) it can lose
    several BLEU. Equal scores keep the average.

    Returns:
        (the chosen key, {key: its greedy valid scores})
    """
    scores = {key: bleu_on_split(t, valid, GREEDY, max_tokens) for key, t in translators.items()}
    if "average" not in scores:
        return "best", scores
    chosen = "average" if scores["average"]["bleu"] >= scores["best"]["bleu"] else "best"
    log.info(
        "finalize: valid greedy BLEU best checkpoint %.2f, average %.2f: reporting the %s",
        scores["best"]["bleu"], scores["average"]["bleu"],
        "average" if chosen == "average" else "best checkpoint",
    )  # fmt: skip
    return chosen, scores


def finalize(
    fin: DictConfig,
    *,
    best_k_models: Mapping[str, Any],
    best: str,
    corpus: Any,
    output_dir: Path,
    extra_test: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the steps of the module docstring; write and return the ``scores.json`` report.

    Args:
        fin: the `finalize` config (average_best, beam_sizes, length_penalties, max_tokens).
        best_k_models: `ModelCheckpoint.best_k_models` of the run.
        best: the best checkpoint (the one `trainer.test` used).
        corpus: the datamodule's `ParallelCorpus` (``load(split)`` gives src/tgt columns), or
            a list of them, one per direction of a multilingual model (each scored with its
            `src_lang`/`tgt_lang`).
        output_dir: the run directory; the average goes next to `best`.
        extra_test: more test splits (`data.extra_test`), scored with the chosen model and
            decoding; one the data lacks is skipped with a warning.
    """
    max_tokens = int(fin.get("max_tokens") or 4096)
    beams, penalties = list(fin.get("beam_sizes") or []), list(fin.get("length_penalties") or [])
    average, averaged = average_best(best_k_models, best, int(fin.get("average_best") or 0))
    report: dict[str, Any] = {
        "best_checkpoint": best,
        "average_checkpoint": average,
        "averaged_from": averaged,
        "valid_models": {},
        "chosen_model": "best",
        "valid_grid": [],
        "chosen": None,
        "test": {},
        "final": None,
        "extra_test": {},
    }
    if average is None and not beams and not extra_test:
        log.info("finalize: no averaging, an empty beam grid and no extra test; nothing to do")
        return report
    translators = {"best": Translator.from_checkpoint(best)}
    if average is not None:
        translators["average"] = Translator.from_checkpoint(average)
    chosen_model, chosen = choose_on_valid(
        report, translators, corpus, beams, penalties, max_tokens
    )
    decodings = {"greedy": GREEDY, **({"chosen": chosen} if chosen is not None else {})}
    test = read_split(corpus, "test")
    for key, translator in translators.items():
        report["test"][key] = {
            name: bleu_on_split(translator, test, config, max_tokens)
            for name, config in decodings.items()
        }
    headline = "chosen" if chosen is not None else "greedy"
    report["final"] = {
        "model": chosen_model, "decoding": headline, **report["test"][chosen_model][headline],
        "checkpoint": average if chosen_model == "average" else best,  # the file to use
    }  # fmt: skip
    for name in extra_test:
        report["extra_test"][name] = score_extra_test(
            translators[chosen_model], corpus, name, decodings, max_tokens
        )
    report["decoding"] = {name: dataclasses.asdict(c) for name, c in decodings.items()}
    path = output_dir / SCORES_FILE
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["scores_file"] = str(path)
    return report


def average_best(
    best_k_models: Mapping[str, Any], best: str, n: int
) -> tuple[str | None, list[str]]:
    """Step 1: average the `n` best distinct checkpoints (`best_checkpoints`) into
    ``avg_best{n}.ckpt`` next to `best`.

    Returns:
        (the average's path, the checkpoints averaged); (None, []) when `n` <= 1 or fewer than
        two checkpoints are kept.
    """
    if n <= 1:
        return None, []
    paths = best_checkpoints(best_k_models, n)
    if len(paths) < 2:
        log.info("finalize: %d checkpoint(s) kept, nothing to average", len(paths))
        return None, []
    if len(paths) < n:
        log.info("finalize: only %d checkpoints kept; averaging those", len(paths))
    average = str(Path(best).parent / f"avg_best{n}.ckpt")
    average_checkpoints(paths, average)
    log.info("finalize: averaged %s → %s", ", ".join(paths), average)
    return average, paths


def read_split(corpus: Any, name: str) -> Split | list[Split]:
    """Split `name` of `corpus`: one `Split`, or one per direction (a list of corpora)."""

    def one(c: Any, multi: bool) -> Split:
        ds = c.load(name)
        langs = (c.src_lang, c.tgt_lang) if multi else (None, None)
        return Split(name, list(ds["src"]), list(ds["tgt"]), *langs)

    if isinstance(corpus, list | tuple):
        return [one(c, True) for c in corpus]
    return one(corpus, False)


def choose_on_valid(
    report: dict[str, Any],
    translators: Mapping[str, Translator],
    corpus: Any,
    beams: Sequence[int],
    penalties: Sequence[float],
    max_tokens: int,
) -> tuple[str, DecodeConfig | None]:
    """Steps 2 and 3, on valid only: the model (`choose_model`, when there is an average) and
    the decoding (`choose_decoding`, when there is a grid); fills `report`'s ``valid_models``,
    ``chosen_model``, ``valid_grid`` and ``chosen``.

    Returns:
        (the chosen model's key, the chosen decoding or None without a grid)
    """
    chosen_model, greedy, chosen = "best", None, None
    if "average" not in translators and not beams:
        return chosen_model, chosen
    valid = read_split(corpus, "valid")
    if "average" in translators:  # choose the model on valid, never on test
        chosen_model, report["valid_models"] = choose_model(translators, valid, max_tokens)
        greedy = report["valid_models"][chosen_model]
    report["chosen_model"] = chosen_model
    if beams:
        chosen, report["valid_grid"] = choose_decoding(
            translators[chosen_model], valid, beams, penalties, max_tokens, greedy
        )
        report["chosen"] = dataclasses.asdict(chosen)
    return chosen_model, chosen


def score_extra_test(
    translator: Translator,
    corpus: Any,
    name: str,
    decodings: Mapping[str, DecodeConfig],
    max_tokens: int,
) -> dict[str, Any]:
    """One extra test split (`data.extra_test`) with every decoding in `decodings`.

    A multilingual model is scored on the directions whose data has the split; the others
    are listed under ``"skipped"`` (direction → why). Nothing found: only ``"skipped"``.
    """
    corpora = list(corpus) if isinstance(corpus, list | tuple) else [corpus]
    multi = isinstance(corpus, list | tuple)
    found: list[Split] = []
    skipped: dict[str, str] = {}
    for c in corpora:
        key = f"{c.src_lang}-{c.tgt_lang}"
        try:
            ds = c.with_split(name).load(name)
        except DataError as exc:  # absent from this corpus: reported, never fatal
            skipped[key] = str(exc)
            log.warning("extra test %s (%s): skipped, %s", name, key, exc)
            continue
        langs = (c.src_lang, c.tgt_lang) if multi else (None, None)
        found.append(Split(name, list(ds["src"]), list(ds["tgt"]), *langs))
    out: dict[str, Any] = {"skipped": skipped} if skipped else {}
    if not found:
        return out
    target: Split | list[Split] = found if multi else found[0]
    for decoding, config in decodings.items():
        out[decoding] = bleu_on_split(translator, target, config, max_tokens)
    return out


__all__ = [
    "Split",
    "average_best",
    "best_checkpoints",
    "bleu_on_split",
    "check_finalize_config",
    "choose_decoding",
    "choose_model",
    "choose_on_valid",
    "finalize",
    "flat_metrics",
    "read_split",
    "score_extra_test",
    "summary_lines",
]
