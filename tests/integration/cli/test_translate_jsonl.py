"""``translate.py input=FILE.jsonl``: prefix and constraints per line, one JSON answer per
line with ``constraints_met``, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _run(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "translate.py"), *overrides],
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=300,
        text=True,
    )


def test_translate_jsonl_with_prefix_and_constraints(ckpt, reference, tmp_path):
    records = [
        {"src": "A red dog runs."},
        {"src": "A big man sleeps here.", "prefix": "Ein alter"},
        {"src": "A small cat eats today.", "constraints": ["Vogel", "hier"]},
        {"src": "A young bird sings.", "prefix": "Ein", "constraints": ["roter Hund"]},
        {"src": "", "prefix": "Ein"},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    proc = _run(f"ckpt_path={ckpt}", f"input={path}", "beam_size=3", "chunk_lines=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    want = reference.translate(
        [r["src"] for r in records],
        beam_size=3,
        prefixes=[r.get("prefix") for r in records],
        constraints=[r.get("constraints") for r in records],
    )
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got == [{"translation": w, "constraints_met": True} for w in want]
    assert want[1].startswith("Ein alter") and "Vogel" in want[2] and want[4] == "Ein"
    assert "constraints" not in proc.stderr


def test_translate_jsonl_flags_unmet_constraints_with_one_warning(ckpt, reference, tmp_path):
    """An empty source cannot hold its constraints: its line says ``constraints_met: false``
    and the run prints one warning line; n_best > 1 lists only hypotheses meeting them."""
    records = [
        {"src": "", "constraints": ["Hund"]},
        {"src": "A red cat eats.", "constraints": ["Vogel"]},
    ]
    records += [{"src": "", "constraints": ["Kater"]}]
    path = tmp_path / "unmet.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    proc = _run(f"ckpt_path={ckpt}", f"input={path}", "beam_size=3", "n_best=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line)["n_best"] for line in proc.stdout.splitlines()]
    assert [[(h["translation"], h["constraints_met"]) for h in g] for g in (got[0], got[2])] == [
        [("", False)],
        [("", False)],
    ]
    assert got[1] and all("Vogel" in h["translation"] and h["constraints_met"] for h in got[1])
    warnings = [line for line in proc.stderr.splitlines() if "constraints" in line]
    assert warnings == [
        f"warning: {path}: 2 of 3 line(s) could not meet all their constraints within the "
        'output budget; their best translations are marked "constraints_met": false'
    ]


@pytest.mark.slow
def test_translate_jsonl_errors_name_the_line(ckpt, tmp_path):
    cases = [
        ('{"src": "A dog."}\n{"src": "A cat."', "line 2: not valid JSON"),
        ('{"src": "A dog.", "prefx": "Ein"}', "line 1: unknown key(s) prefx"),
        ('["A dog."]', "line 1: expected a JSON object"),
        ('{"src": "A dog.", "constraints": [""]}', "line 1: a constraint must not be empty"),
        (
            '{"src": "A dog.", "constraints": ["5 €"]}',
            "line 1: the constraint '5 €' has characters the model's target vocabulary lacks: ",
        ),
        ('{"src": "A dog.", "prefix": "€"}', "line 1: the prefix '€' has characters the model"),
    ]
    for text, message in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(text + "\n", "utf-8")
        proc = _run(f"ckpt_path={ckpt}", f"input={path}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
