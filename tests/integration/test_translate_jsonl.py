"""``translate.py input=FILE.jsonl``: prefix and constraints per line, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
    assert proc.stdout.splitlines() == want
    assert want[1].startswith("Ein alter") and "Vogel" in want[2] and want[4] == "Ein"


def test_translate_jsonl_errors_name_the_line(ckpt, tmp_path):
    cases = [
        ('{"src": "A dog."}\n{"src": "A cat."', "line 2: not valid JSON"),
        ('{"src": "A dog.", "prefx": "Ein"}', "line 1: unknown key(s) prefx"),
        ('["A dog."]', "line 1: expected a JSON object"),
        ('{"src": "A dog.", "constraints": [""]}', "line 1: a constraint must not be empty"),
    ]
    for text, message in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(text + "\n", "utf-8")
        proc = _run(f"ckpt_path={ckpt}", f"input={path}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
