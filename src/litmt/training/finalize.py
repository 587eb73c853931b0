"""The end of a training run (`finalize` config): average the best checkpoints, choose the
beam size and length penalty on the valid split, score test, write ``scores.json``.

Order, so that test never influences a choice:

1. average the `average_best` checkpoints with the highest validation BLEU
   (`litmt.checkpoint.average.average_checkpoints`) into ``<checkpoints>/avg_best{N}.ckpt``;
2. choose the model on **valid**: the average unless its greedy BLEU is below the best
   checkpoint's (an average that includes early checkpoints of a short run can be worse);
3. decode **valid** with every (beam size, length penalty) of the grid, using that model,
   and keep the point with the highest BLEU (ties: the first in grid order);
4. decode **test** with the best checkpoint and the average, each greedy and with the
   choice; the ``final`` score is the chosen model with the chosen decoding;
5. score the extra test sets (`data.extra_test`, e.g. ``test2017``) with the chosen model
   and decodings; sets the data lack are skipped with a warning. They choose nothing.

Data come from the training datamodule's corpus (`ParallelCorpus.load`); decoding is
`Translator.translate`, BLEU and chrF `litmt.metrics.corpus_scores` (sacreBLEU), in
`bleu_on_split`. A multilingual model (`data.directions`) is scored on every direction's
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
from litmt.decoding.config import DecodeConfig
from litmt.decoding.translator import Translator
from litmt.errors import ConfigError, DataError
from litmt.metrics import corpus_scores

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
        ConfigError: `average_best` is negative or above `model_checkpoint.save_top_k`, or
        the grid has only one of its two lists.
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
    beams, penalties = list(fin.get("beam_sizes") or []), list(fin.get("length_penalties") or [])
    if bool(beams) != bool(penalties):
        raise ConfigError(
            "finalize.beam_sizes and finalize.length_penalties go together: give both or neither"
        )


def best_checkpoints(best_k_models: Mapping[str, Any], n: int) -> list[str]:
    """The `n` existing checkpoints with the highest validation score, best first.

    Args:
        best_k_models: `ModelCheckpoint.best_k_models` ({path: monitored score}, mode max).
        n: how many.
    """
    ranked = sorted(best_k_models.items(), key=lambda kv: float(kv[1]), reverse=True)
    return [str(p) for p, _ in ranked if Path(p).is_file()][:n]


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
    n = int(fin.get("average_best") or 0)
    beams, penalties = list(fin.get("beam_sizes") or []), list(fin.get("length_penalties") or [])
    models: dict[str, list[str]] = {"best": [best]}
    average: str | None = None
    if n > 1:
        paths = best_checkpoints(best_k_models, n)
        if len(paths) < 2:
            log.info("finalize: %d checkpoint(s) kept, nothing to average", len(paths))
        else:
            if len(paths) < n:
                log.info("finalize: only %d checkpoints kept; averaging those", len(paths))
            average = str(Path(best).parent / f"avg_best{n}.ckpt")
            average_checkpoints(paths, average)
            log.info("finalize: averaged %s → %s", ", ".join(paths), average)
            models["average"] = paths
    report: dict[str, Any] = {
        "best_checkpoint": best,
        "average_checkpoint": average,
        "averaged_from": models.get("average", []),
        "valid_models": {},
        "chosen_model": "best",
        "valid_grid": [],
        "chosen": None,
        "test": {},
        "final": None,
        "extra_test": {},
    }
    if len(models) == 1 and not beams and not extra_test:
        log.info("finalize: no averaging, an empty beam grid and no extra test; nothing to do")
        return report

    def one(c: Any, name: str, multi: bool) -> Split:
        ds = c.load(name)
        langs = (c.src_lang, c.tgt_lang) if multi else (None, None)
        return Split(name, list(ds["src"]), list(ds["tgt"]), *langs)

    def split(name: str) -> Split | list[Split]:
        if isinstance(corpus, list | tuple):
            return [one(c, name, True) for c in corpus]
        return one(corpus, name, False)

    translators = {
        key: Translator.from_checkpoint(average if key == "average" else best) for key in models
    }
    chosen_model, greedy = "best", None
    if "average" in translators:  # choose the model on valid, never on test
        chosen_model, report["valid_models"] = choose_model(translators, split("valid"), max_tokens)
        greedy = report["valid_models"][chosen_model]
    report["chosen_model"] = chosen_model
    chosen: DecodeConfig | None = None
    if beams:
        chosen, report["valid_grid"] = choose_decoding(
            translators[chosen_model], split("valid"), beams, penalties, max_tokens, greedy
        )
        report["chosen"] = dataclasses.asdict(chosen)
    test = split("test")
    decodings = {"greedy": GREEDY, **({"chosen": chosen} if chosen is not None else {})}
    for key, translator in translators.items():
        report["test"][key] = {
            name: bleu_on_split(translator, test, config, max_tokens)
            for name, config in decodings.items()
        }
    headline = "chosen" if chosen is not None else "greedy"
    report["final"] = {
        "model": chosen_model, "decoding": headline, **report["test"][chosen_model][headline]
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


def _score_lines(prefix: str, s: Mapping[str, float]) -> list[str]:
    lines = [f"{prefix}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}"]
    for key in sorted(k for k in s if k.startswith("bleu_")):  # per direction
        lines.append(f"{prefix} {key[5:]}: BLEU {s[key]:.2f}")
    return lines


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The final log lines: the model and decoding chosen on valid, one line of test scores
    per model and decoding, the final score, then the extra test sets."""
    lines = []
    valid_models = report.get("valid_models") or {}
    if "average" in valid_models:
        v = {k: s["bleu"] for k, s in valid_models.items()}
        lines.append(
            f"model chosen on valid: {report['chosen_model']} (greedy BLEU average "
            f"{v['average']:.2f}, best checkpoint {v['best']:.2f})"
        )
    if report.get("chosen"):
        c = report["chosen"]
        grid = report.get("valid_grid") or []
        # the choice is the grid's highest valid BLEU (choose_decoding)
        valid = f" (valid BLEU {max(g['bleu'] for g in grid):.2f})" if grid else ""
        lines.append(
            f"chosen on valid: beam {c['beam_size']}, length penalty {c['length_penalty']}{valid}"
        )
    for model, by_decoding in report.get("test", {}).items():
        for decoding, s in by_decoding.items():
            lines.extend(_score_lines(f"test {model} {decoding}", s))
    if final := report.get("final"):
        lines.extend(_score_lines(f"final test ({final['model']}, {final['decoding']})", final))
    for name, by_decoding in (report.get("extra_test") or {}).items():
        for decoding, s in by_decoding.items():
            if decoding == "skipped":
                lines.extend(f"extra test {name} {d}: skipped (not in the data)" for d in s)
            else:
                lines.extend(_score_lines(f"extra test {name} {decoding}", s))
    if report.get("scores_file"):
        lines.append(f"scores: {report['scores_file']}")
    return lines


def flat_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    """`train()`'s extra metrics: ``final/<model>/<decoding>/<metric>``, ``final/bleu`` (the
    model and decoding chosen on valid), ``final/extra/<split>/<decoding>/<metric>`` and the
    paths."""
    out: dict[str, Any] = {
        f"final/{model}/{decoding}/{metric}": value
        for model, by_decoding in report.get("test", {}).items()
        for decoding, scores in by_decoding.items()
        for metric, value in scores.items()
    }
    out.update(
        {
            f"final/extra/{name}/{decoding}/{metric}": value
            for name, by_decoding in (report.get("extra_test") or {}).items()
            for decoding, scores in by_decoding.items()
            if decoding != "skipped"
            for metric, value in scores.items()
        }
    )
    if final := report.get("final"):
        out["final/bleu"], out["final/chrf"] = final["bleu"], final["chrf"]
        out["final/model"] = final["model"]
    if report.get("chosen"):
        out["final/beam_size"] = report["chosen"]["beam_size"]
        out["final/length_penalty"] = report["chosen"]["length_penalty"]
    out["average_checkpoint"] = report.get("average_checkpoint")
    out["scores_file"] = report.get("scores_file")
    return out


__all__ = [
    "Split",
    "best_checkpoints",
    "bleu_on_split",
    "check_finalize_config",
    "choose_decoding",
    "choose_model",
    "finalize",
    "flat_metrics",
    "score_extra_test",
    "summary_lines",
]
