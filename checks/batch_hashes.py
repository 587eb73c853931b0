"""Hash every batch the DataModule serves under a fixed seed: a before/after check for
changes that must not move a single token.

For each case (a small corpus it writes itself: one pair; one pair with a tagged
`extra_train` source; three directions with the language tag on the source side; three
directions with the tag on the target side, temperature sampling and a tagged source of
one direction) it prints the sha256 (first 16 hex digits) over the tensors of every batch,
in order (the extra-tagged case pads to multiples of 8, the multi-source one buckets
in pools of 4 batches under a sentence cap), of:

- ``train e0`` / ``train e1``: the training batches of epochs 0 and 1;
- ``valid`` / ``test``: the evaluation batches;
- ``resume e1@3``: epoch 1 after a loader's `state_dict` at batch 3 was loaded into a fresh
  DataModule's loader (and whether it equals the tail of ``train e1``);
- ``meta``: references, sources, direction spans, forced prefixes, languages, filter
  counts and the cache folder names;
- ``rank R/2 ...``: the same train/valid batches of each rank of a 2-process gloo group;
- ``ranks train eE examples``: the example indexes of epoch E's batches of every rank
  together, sorted, and whether they are the ones one process serves (temperature sampling
  draws each epoch's examples as a function of (seed, epoch), the same on every rank).

    python -m checks.batch_hashes                  # the table (markdown)
    python -m checks.batch_hashes --out h.json     # also as JSON, to compare two trees
    PYTHONPATH=OTHER_TREE/src python -m checks.batch_hashes --out before.json

Run it from the repository root. Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from benchmarks.hf_models import DE_WORDS, EN_WORDS
from litmt.data import TranslationDataModule

REPO = Path(__file__).resolve().parents[1]
LANGS = {"de": DE_WORDS, "fr": [w + "e" for w in DE_WORDS], "cs": [w + "y" for w in DE_WORDS]}
DIRECTIONS = ["en-de", "en-fr", "en-cs"]
N_WORDS = min(len(EN_WORDS), len(DE_WORDS))  # word ids of the synthetic sentences
RESUME_AT = 3  # batches of epoch 1 consumed before the loader state is saved
MTIME_NS = 1_700_000_000 * 10**9  # every corpus file's mtime: the same cache names in every run


def write_corpus(root: Path, sizes: dict[str, int], seed: int) -> Path:
    """`{root}/{split}.{en,de,fr,cs}`: line-aligned synthetic sentences (word-by-word)."""
    root.mkdir(parents=True, exist_ok=True)
    for k, (split, n) in enumerate(sizes.items()):
        rng = random.Random(seed + k)
        rows = [[rng.randrange(N_WORDS) for _ in range(rng.randint(1, 14))] for _ in range(n)]
        for lang, words in {"en": EN_WORDS, **LANGS}.items():
            text = "\n".join(" ".join(words[i] for i in ids) for ids in rows) + "\n"
            path = root / f"{split}.{lang}"
            path.write_text(text, encoding="utf-8")
            os.utime(path, ns=(MTIME_NS, MTIME_NS))  # cache keys hold paths and mtimes
    return root


def cases(work: Path) -> dict[str, dict[str, Any]]:
    """Case name -> `TranslationDataModule` keyword arguments (every setting spelled out)."""
    corpus = write_corpus(work / "corpus", {"train": 400, "valid": 50, "test": 30}, seed=0)
    bt = write_corpus(work / "bt", {"train": 120}, seed=10)
    base = {
        "name": "hashes", "dir": str(corpus), "cache_dir": None, "max_tokens": 256,
        "batch_size": None, "eval_max_tokens": 300, "eval_batch_size": None, "num_workers": 0,
        "num_proc": 1, "seed": 7, "shuffle": True, "bucket_pool": None, "max_positions": 1024,
        "pin_memory": False, "pad_to_multiple": None,
        "tokenizer": {"vocab_size": 90, "model_type": "unigram", "character_coverage": 1.0},
        "filter": {"min_len": 1, "max_len": 256, "max_ratio": 3.0, "dedup": False},
    }  # fmt: skip
    multi = {**base, "directions": DIRECTIONS}
    out = {
        "one-pair": base,
        "extra-tagged": {
            **base,
            "extra_train": [{"name": "bt", "dir": str(bt), "tag": "<BT>"}],
            "pad_to_multiple": 8,
        },
        "multi-source": {**multi, "tag_placement": "source", "bucket_pool": 4, "batch_size": 24},
        "multi-target": {
            **multi,
            "tag_placement": "target",
            "sampling_temperature": 5.0,
            "extra_train": [{"name": "bt", "dir": str(bt), "tag": "<BT>", "direction": "en-fr"}],
        },
    }
    for name, kw in out.items():
        kw["cache_dir"] = str(work / "cache" / name)
    return out


def digest(batches: Iterable[dict[str, Any]]) -> tuple[int, str]:
    """(batch count, sha256 over every batch's keys, dtypes, shapes and values, in order)."""
    h, n = hashlib.sha256(), 0
    for batch in batches:
        n += 1
        for key in sorted(batch):
            value = batch[key]
            h.update(key.encode())
            if isinstance(value, torch.Tensor):  # e.g. src (B, S), tgt_in (B, T)
                h.update(f"{value.dtype}{tuple(value.shape)}".encode())
                h.update(value.contiguous().numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return n, h.hexdigest()[:16]


def epoch_batches(dm: TranslationDataModule, epoch: int) -> list[dict[str, Any]]:
    loader = dm.train_dataloader()
    loader.set_epoch(epoch)
    return list(loader)


def meta(dm: TranslationDataModule) -> str:
    """A hash of what the DataModule tells the rest of litmt besides batches."""
    n = len(dm.references("valid"))
    root = Path(dm.cache_dir)
    names = [
        dm.tokenizer_dir().relative_to(root),
        dm.prepared_marker().relative_to(root),
        *(dm._cache_path(s, dm.tokenizer).relative_to(root) for s in ("train", "valid", "test")),
    ]
    record = [
        dm.references("valid"), dm.sources("valid"), dm.references("test"),
        dm.direction_spans("valid"), dm.forced_prefixes("valid", list(range(n))),
        dm.languages_meta(), dm.filter_counts, dm.src_lang, dm.tgt_lang,
        [str(p) for p in names], sorted(dm.tokenizer_settings.user_defined_symbols),
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(record, default=str).encode()).hexdigest()[:16]


def one_process(kw: dict[str, Any]) -> dict[str, Any]:
    """Every part of one case in this process."""
    dm = TranslationDataModule(**kw)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    e1 = epoch_batches(dm, 1)
    rows = {
        "train e0": digest(epoch_batches(dm, 0)),
        "train e1": digest(e1),
        "valid": digest(dm.val_dataloader()),
        "test": digest(dm.test_dataloader()),
    }
    loader = dm.train_dataloader()
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(RESUME_AT):
        next(it)
    state = loader.state_dict()
    fresh = TranslationDataModule(**kw)
    fresh.setup("fit")
    resumed = fresh.train_dataloader()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = digest(resumed)
    same = rest == digest(e1[RESUME_AT:])
    rows[f"resume e1@{RESUME_AT}"] = (rest[0], rest[1] + ("" if same else " (!= tail of e1)"))
    rows["meta"] = (0, meta(dm))
    return rows


def rank_worker(kw: dict[str, Any], rank: int, world: int, init: str, out: Path) -> None:
    """One rank of a gloo group: its train (epochs 0, 1) and valid batches, to `out`."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        dm = TranslationDataModule(**kw)
        dm.setup("fit")  # the parent prepared the caches
        rows: dict[str, Any] = {}
        for epoch in (0, 1):
            batches = epoch_batches(dm, epoch)
            rows[f"rank {rank}/{world} train e{epoch}"] = digest(batches)
            rows[f"_indices e{epoch}"] = [i for b in batches for i in b["index"].tolist()]
        rows[f"rank {rank}/{world} valid"] = digest(dm.val_dataloader())
        out.write_text(json.dumps(rows), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def ranks(kw: dict[str, Any], work: Path, world: int = 2) -> dict[str, Any]:
    """`rank_worker` in `world` fresh processes (the same PYTHONPATH: the same litmt)."""
    init = f"file://{work / 'pg'}"
    (work / "pg").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "checks.batch_hashes", "--world", str(world)]
    cmd += ["--init", init, "--kw", json.dumps(kw)]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r), "--out", str(work / f"r{r}")], cwd=REPO, env=env)
        for r in range(world)
    ]
    if any(p.wait(timeout=600) != 0 for p in procs):
        raise SystemExit("a rank failed")
    rows: dict[str, Any] = {}
    indices: dict[str, list[int]] = {}
    for r in range(world):
        for key, value in json.loads((work / f"r{r}").read_text(encoding="utf-8")).items():
            if key.startswith("_indices"):
                indices.setdefault(key, []).extend(value)
            else:
                rows[key] = value
    one = TranslationDataModule(**kw)
    one.setup("fit")
    for epoch in (0, 1):
        union = sorted(indices[f"_indices e{epoch}"])
        alone = sorted(i for b in epoch_batches(one, epoch) for i in b["index"].tolist())
        h = hashlib.sha256(json.dumps(union).encode()).hexdigest()[:16]
        rows[f"ranks train e{epoch} examples"] = (
            len(union), h + ("" if union == alone else " (!= one process)")
        )  # fmt: skip
    return rows


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| case | part | batches | sha256[:16] |", "|---|---|---:|---|"]
    for case, rows in results.items():
        for part, (n, h) in rows.items():
            lines.append(f"| {case} | {part} | {n} | {h} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="also write the hashes as JSON here")
    p.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "litmt-batch-hashes",
        help="scratch folder, emptied first (fixed, so that two runs key their caches alike)",
    )  # fmt: skip
    p.add_argument("--cases", default="one-pair,extra-tagged,multi-source,multi-target")
    p.add_argument("--ddp-cases", default="one-pair,multi-target", help="cases run on 2 ranks")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a rank_worker process
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--kw", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        rank_worker(json.loads(args.kw), args.rank, args.world, args.init, Path(args.out))
        return 0
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    results = {}
    for name, kw in cases(work).items():
        if name not in args.cases.split(","):
            continue
        results[name] = one_process(kw)
        if name in args.ddp_cases.split(","):
            results[name].update(ranks(kw, work))
    shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
