"""Helpers for training tests: a toy parallel corpus and the real Hydra config, shrunk."""

from __future__ import annotations

import random
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
# two DDP processes on the CPU (gloo backend): the trainer overrides of the multi-process tests
TWO_CPU_RANKS = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]

WORDS = [
    "a",
    "man",
    "woman",
    "dog",
    "cat",
    "child",
    "runs",
    "walks",
    "sits",
    "on",
    "the",
    "street",
    "in",
    "park",
    "with",
    "red",
    "blue",
    "big",
    "small",
    "ball",
]
GERMAN = [
    "ein",
    "mann",
    "frau",
    "hund",
    "katze",
    "kind",
    "rennt",
    "geht",
    "sitzt",
    "auf",
    "der",
    "strasse",
    "im",
    "park",
    "mit",
    "rot",
    "blau",
    "gross",
    "klein",
    "ball",
]
LEXICON = dict(zip(WORDS, GERMAN, strict=True))


def write_toy_corpus(directory: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """Word-by-word 'translation' pairs, {train,valid,test}.{en,de}: learnable in seconds."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (sizes or {"train": 600, "valid": 40, "test": 40}).items():
        src, tgt = [], []
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
            src.append(" ".join(words))
            tgt.append(" ".join(LEXICON[w] for w in words))
        (directory / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return directory


def tiny_overrides(corpus: Path, out: Path) -> list[str]:
    """Overrides that make the real config train a tiny model on `corpus` in seconds."""
    return [
        "model=tiny",
        f"data.dir={corpus}",
        "data.splits.test=test",
        "data.tokenizer.vocab_size=64",
        f"data.cache_dir={out / 'data'}",
        "data.max_tokens=512",
        "data.num_workers=0",
        "logger=csv",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        f"hydra.run.dir={out / 'run'}",
    ]


def compose_train(overrides: list[str], out: Path) -> DictConfig:
    """Compose conf/train.yaml with `overrides` (as the script would), outside a Hydra run."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out / "run")
    return cfg


def lr_schedule(**overrides: object):
    """The `module.scheduler` partial of conf/train.yaml with `overrides` (its defaults come from
    the YAML only, as in a training run)."""
    import hydra
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(REPO / "conf" / "train.yaml").module.scheduler
    return hydra.utils.instantiate(OmegaConf.merge(cfg, overrides))


def free_port() -> int:
    """A free TCP port on 127.0.0.1: MASTER_PORT for a test's gloo process group."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_method() -> str:
    """How a test starts its gloo ranks: "fork" (fast: the children reuse the imported modules)
    when this process runs torch on one thread, else "spawn".

    A child forked after the parent ran an OpenMP parallel region (torch with more than one
    intra-op thread, e.g. OMP_NUM_THREADS=2) hangs in its first parallel op: GNU libgomp's
    thread pool does not survive fork (GCC bug 52303), and torch's CPU wheels use libgomp.
    """
    import torch

    return "fork" if torch.get_num_threads() == 1 else "spawn"


def script_env() -> dict[str, str]:
    """Environment for `scripts/*.py` subprocesses: one thread, tests/helpers importable (probe callbacks)."""
    import os

    path = [str(REPO / "tests" / "helpers"), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }


def run_train_script(overrides: list[str], timeout: float = 600):
    """`python scripts/train.py OVERRIDES` in a subprocess; returns the CompletedProcess."""
    import subprocess
    import sys

    cmd = [sys.executable, "scripts/train.py", *overrides]
    return subprocess.run(
        cmd, cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=timeout
    )
