"""The end step's report as text and as metrics: `summary_lines` (the final log lines) and
`flat_metrics` (`train()`'s ``final/...`` metrics), both read from the ``scores.json`` report
that `litmt.training.finalize.finalize` writes."""

from __future__ import annotations

import csv
import re
import shlex
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from litmt.records import Record, machine_description, utc_now


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
        if final.get("checkpoint"):
            lines.append(f"model to use: {final['checkpoint']}")
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


def record_values(report: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """The numbers of a ``scores.json`` report as a result record's values and units: the
    final test score (the model and decoding chosen on valid, per direction too), the chosen
    model's greedy score, the decoding chosen on valid, and each extra test set."""
    values: dict[str, float] = {}
    units: dict[str, str] = {}

    def scores(prefix: str, s: Mapping[str, Any]) -> None:
        for metric, value in s.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[f"{prefix}_{metric}"] = round(float(value), 2)  # as the log prints it
                units[f"{prefix}_{metric}"] = "chrF" if "chrf" in metric else "BLEU"

    final = report.get("final")
    if final:
        scores("test", {k: v for k, v in final.items() if k in ("bleu", "chrf")})
        greedy = report.get("test", {}).get(final["model"], {}).get("greedy")
        if greedy and final["decoding"] != "greedy":
            scores("test_greedy", greedy)
    if chosen := report.get("chosen"):
        values["chosen_beam_size"] = float(chosen["beam_size"])
        values["chosen_length_penalty"] = float(chosen["length_penalty"])
    for name, by_decoding in (report.get("extra_test") or {}).items():
        for decoding, s in by_decoding.items():
            if decoding != "skipped":
                scores(f"{name}_{decoding}", s)
    return values, units


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def wall_minutes(run_dir: Path) -> float | None:
    """Minutes from the run's first log line (``train.log``) to its ``scores.json``: the
    command's wall time, training and the end step together (None without both)."""
    log_file, scores = Path(run_dir) / "train.log", Path(run_dir) / "scores.json"
    if not (log_file.is_file() and scores.is_file()):
        return None
    with log_file.open(encoding="utf-8") as f:
        for line in f:
            if m := _LOG_TIME.match(line):
                start = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S")
                end = datetime.fromtimestamp(scores.stat().st_mtime)
                return round((end - start).total_seconds() / 60, 1)
    return None


def run_record(
    run_dir: Path, report: Mapping[str, Any], record_id: str, title: str | None = None
) -> Record:
    """A result record of a finished training run: `record_values` of its report, the
    optimizer steps it ran (its CSV log), the command (``scripts/train.py`` with the run's
    Hydra overrides), this machine and the time now."""
    run_dir = Path(run_dir)
    values, units = record_values(report)
    steps = [
        int(row["step"])
        for path in sorted(run_dir.glob("csv/*/metrics.csv"))
        for row in csv.DictReader(path.open(encoding="utf-8"))
        if row.get("step")
    ]
    if steps:
        values["train_steps"] = float(max(steps) + 1)
    if (minutes := wall_minutes(run_dir)) is not None:
        values["wall_min"], units["wall_min"] = minutes, "minutes"
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
    command = " ".join(
        ["python scripts/train.py", *(shlex.quote(o) for o in overrides if "hydra." not in o)]
    )
    final = report.get("final") or {}
    return Record(
        id=record_id,
        title=title or f"{record_id}: test score of the model and decoding chosen on valid",
        date=utc_now(),
        machine=machine_description(),
        command=command,
        values=values,
        units=units,
        notes=(
            f"final = the {final.get('model', '?')} model with the {final.get('decoding', '?')} "
            "decoding, both chosen on valid (scores.json); detokenised, cased sacreBLEU"
        ),
    )


__all__ = ["flat_metrics", "record_values", "run_record", "summary_lines"]
