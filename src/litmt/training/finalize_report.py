"""The end step's report as text and as metrics: `summary_lines` (the final log lines) and
`flat_metrics` (`train()`'s ``final/...`` metrics), both read from the ``scores.json`` report
that `litmt.training.finalize.finalize` writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


__all__ = ["flat_metrics", "summary_lines"]
