"""Decode a grid of settings on fixed models and hash every output: a before/after check for
changes that must not move a single token of decoding.

The models: the legacy fixture (``tests/fixtures/legacy_v0_1/tiny.ckpt``, a trained tiny
en→de model) and a seeded noisy copy of it (its weights plus Gaussian noise, so the search
meets closer calls), each on the torch and the ct2 engine, and their two-model ensemble on
torch. The settings: greedy; beam 1, 2 and 5 under length penalties 0, 0.6 and 1; n-best 3;
``min_len``; short output budgets; sampling with seeds, top-k, top-p and temperature; each
without steering, with a target prefix, with one constraint and with several (multi-piece)
constraints; each in one batch and in batches of a few tokens. A setting an engine refuses
is recorded by its one-line message.

It uses only the public API (``litmt.load_translator``), so it runs on any tree:

    python -m checks.decode_outputs --out after.json
    PYTHONPATH=OTHER_TREE/src python -m checks.decode_outputs --out before.json
    python -m checks.decode_outputs --compare before.json after.json

Run it from the repository root.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import litmt

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "legacy_v0_1" / "tiny.ckpt"
WORDS = {
    "adj": ["red", "big", "small", "old", "young"],
    "noun": ["dog", "man", "boy", "cat", "bird"],
    "verb": ["runs", "sleeps", "eats", "sings", "walks"],
    "place": ["", "outside", "here", "today"],
}
SEARCHES: dict[str, dict[str, Any]] = {
    "greedy": {"method": "greedy"},
    **{
        f"beam{k}-lp{lp}": {"beam_size": k, "length_penalty": lp}
        for k, lp in itertools.product((1, 2, 5), (0.0, 0.6, 1.0))
    },
    "nbest3-lp0.6": {"beam_size": 5, "n_best": 3, "length_penalty": 0.6},
    "nbest3-lp1": {"beam_size": 5, "n_best": 3},
    "minlen8-greedy": {"beam_size": 1, "min_len": 8},
    "minlen8-beam5": {"beam_size": 5, "min_len": 8},
    "budget3-greedy": {"beam_size": 1, "max_len_a": 0.0, "max_len_b": 3},
    "budget3-beam5": {"beam_size": 5, "max_len_a": 0.0, "max_len_b": 3},
    "budget-half-beam5": {"beam_size": 5, "max_len_a": 0.5, "max_len_b": 0},
    "sample-seed1": {"method": "sample", "seed": 1},
    "sample-seed2-n3": {"method": "sample", "seed": 2, "n_best": 3},
    "sample-topk5": {"method": "sample", "seed": 3, "top_k": 5},
    "sample-topp0.9": {"method": "sample", "seed": 4, "top_p": 0.9},
    "sample-temp0.5": {"method": "sample", "seed": 5, "temperature": 0.5},
}
STEERING = ("none", "prefix", "one-constraint", "constraints")
BATCHING = {"one-batch": 4096, "small-batches": 24}


def sentences(n: int = 16, seed: int = 0) -> list[str]:
    """`n` template sentences of the fixture's vocabulary, some longer than it trained on."""
    rng = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        pick = {k: v[int(torch.randint(len(v), (1,), generator=rng))] for k, v in WORDS.items()}
        words = ["A", pick["adj"], pick["noun"], pick["verb"], pick["place"]]
        if i % 4 == 3:  # a longer one: two clauses
            words += ["and", "a", WORDS["noun"][i % 5], WORDS["verb"][(i + 1) % 5]]
        out.append(" ".join(w for w in words if w) + ".")
    return out


def noisy_copy(path: Path, out: Path, seed: int = 7, scale: float = 0.05) -> Path:
    """Checkpoint `path` with `scale` Gaussian noise added to every floating weight."""
    raw = torch.load(path, weights_only=True)
    gen = torch.Generator().manual_seed(seed)
    state = {
        k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        if v.is_floating_point()
        else v
        for k, v in raw["state_dict"].items()
    }
    torch.save({**raw, "state_dict": state}, out)
    return out


def steering(kind: str, n: int) -> dict[str, Any]:
    """The prefixes/constraints keyword arguments of one steering kind for `n` sentences."""
    if kind == "prefix":
        return {"prefixes": ["Ein" if i % 2 == 0 else None for i in range(n)]}
    if kind == "one-constraint":
        return {"constraints": [["Hund"] if i % 3 == 0 else None for i in range(n)]}
    if kind == "constraints":
        return {"constraints": [["heute", "großer Mann"] if i % 2 else ["Vogel"] for i in range(n)]}
    return {}


def run_grid(translators: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """Every (model, search, steering, batching) cell: its n-best texts and scores, or the
    message of the error it raised."""
    results: dict[str, Any] = {}
    for (name, tr), (search, opts), kind, (batching, max_tokens) in itertools.product(
        translators.items(), SEARCHES.items(), STEERING, BATCHING.items()
    ):
        key = f"{name}|{search}|{kind}|{batching}"
        try:
            rows = tr.translate(
                texts,
                return_scores=True,
                max_tokens=max_tokens,
                **steering(kind, len(texts)),
                **opts,
            )
        except litmt.LitmtError as err:
            results[key] = {"error": str(err)}
            continue
        results[key] = [[[t, round(float(s), 4)] for t, s in row] for row in rows]
    return results


def build(work: Path) -> dict[str, Any]:
    """The translators: fixture and noisy copy on torch and ct2, and their torch ensemble."""
    noisy = noisy_copy(FIXTURE, work / "noisy.ckpt")
    out = {}
    for model, path in (("fixture", FIXTURE), ("noisy", noisy)):
        out[f"{model}/torch"] = litmt.load_translator(path, engine="torch", device="cpu")
        out[f"{model}/ct2"] = litmt.load_translator(
            path, engine="ct2", device="cpu", threads=1, ct2_cache_dir=work / "ct2"
        )
    out["ensemble/torch"] = litmt.load_translator(
        [FIXTURE, noisy], engine="torch", device="cpu", ensemble=True
    )
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Print the cells that differ; return their count."""
    keys = sorted(set(before) | set(after))
    differ = [k for k in keys if before.get(k) != after.get(k)]
    for k in differ[:20]:
        print(f"differs: {k}\n  before {before.get(k)}\n  after  {after.get(k)}")
    n_sent = sum(len(v) for v in after.values() if isinstance(v, list))
    n_hyp = sum(len(r) for v in after.values() if isinstance(v, list) for r in v)
    n_err = sum(1 for v in after.values() if isinstance(v, dict))
    print(
        f"{len(keys)} cells ({n_err} refused with a message), {n_sent} sentences, "
        f"{n_hyp} hypotheses: {len(differ)} differ"
    )
    return len(differ)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the outputs as JSON")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = p.parse_args(argv)
    if args.compare:
        before, after = (json.loads(f.read_text()) for f in args.compare)
        return 1 if compare(before, after) else 0
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_grid(build(Path(tmp)), sentences())
    blob = json.dumps(results, sort_keys=True, ensure_ascii=False)
    print(f"{len(results)} cells, sha256 {hashlib.sha256(blob.encode()).hexdigest()[:16]}")
    if args.out:
        args.out.write_text(blob)
    return 0


if __name__ == "__main__":
    sys.exit(main())
