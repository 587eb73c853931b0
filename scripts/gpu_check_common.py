"""What the rows of `scripts/gpu_check.py` share: `conf/` read with PyYAML, the deadline, the
corpus (Multi30k or the dry run's toy pairs), one seeded Lightning training run (`train_run`),
which kernels can run here, and the `State` one run's rows read and fill. Imports no Hydra,
omegaconf, `datasets` or wandb (the GPU image has none).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib
import importlib.util
import random
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from gpu_check_rows import Rows
from torch.utils.data import DataLoader

from litmt.attention import get_backend_class
from litmt.data.batching.collate import TokenizedPairs, collate
from litmt.data.batching.sampler import TokenBudgetBatchSampler
from litmt.data.text import read_text_file
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.runtime.fp8 import fp8_precision_plugin, pad_multiple_for
from litmt.training.module import TranslationModule

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Kernels that compute exact attention; the optional package each one needs.
EXACT = ("sdpa", "math", "flex", "flash", "xformers", "te")
PACKAGES = {"flash": "flash_attn", "xformers": "xformers", "te": "transformer_engine"}
DISTRIBUTIONS = {"flash_attn": "flash-attn", "transformer_engine": "transformer-engine"}
LOSS_TOLERANCE = 0.02  # parity: final loss within 2 % of sdpa's (same seed, same batches)
TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}
FILES = ("train.en", "train.de", "test2016.en", "test2016.de")


# -- config, read from conf/ without Hydra ---------------------------------------------------
def read_yaml(rel: str) -> dict[str, Any]:
    return yaml.safe_load((CONF / rel).read_text(encoding="utf-8")) or {}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, nested dicts key by key (Hydra's override rule)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def model_group(name: str) -> dict[str, Any]:
    """conf/model/NAME.yaml on top of conf/model/base.yaml (its `defaults`)."""
    node = read_yaml("model/base.yaml")
    if name != "base":
        node = merge(node, read_yaml(f"model/{name}.yaml"))
    node.pop("defaults", None)
    return node


def factory(node: dict[str, Any], **override: Any) -> functools.partial:
    """A `_target_` + `_partial_: true` node as a partial (what hydra.utils.instantiate does)."""
    module, _, name = node["_target_"].rpartition(".")
    kwargs = {k: v for k, v in node.items() if not k.startswith("_")}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in {**kwargs, **override}.items()}
    return functools.partial(getattr(importlib.import_module(module), name), **kwargs)


TRAIN_MODULE = read_yaml("train.yaml")["module"]  # optimiser and schedule of scripts/train.py
RECIPE = read_yaml("experiment/multi30k_cpu.yaml")  # the CPU recipe (model small + overrides)


# -- the run ------------------------------------------------------------------------------
class Deadline:
    """The script's wall-clock deadline (`--deadline-s`), shared by every step."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# -- data ------------------------------------------------------------------------------------
def write_toy_corpus(path: Path, seed: int = 0) -> Path:
    """Word-for-word en-de pairs in the Multi30k file layout (the dry run's data)."""
    words = {"a": "ein", "dog": "hund", "red": "rot", "runs": "rennt", "man": "mann", "big": "groß"}
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 400), ("test2016", 20)):
        pairs = [[rng.choice(list(words)) for _ in range(rng.randint(3, 8))] for _ in range(n)]
        (path / f"{split}.en").write_text("".join(" ".join(p) + "\n" for p in pairs), "utf-8")
        de = "".join(" ".join(words[w] for w in p) + "\n" for p in pairs)
        (path / f"{split}.de").write_text(de, "utf-8")
    return path


class Corpus:
    """Multi30k's train pairs, tokenised once, and the test2016 text."""

    def __init__(self, data: Path, out: Path, vocab_size: int) -> None:
        src, tgt = (read_text_file(data / f, f) for f in ("train.en", "train.de"))
        self.test_src = read_text_file(data / "test2016.en", "test2016.en")
        self.test_ref = read_text_file(data / "test2016.de", "test2016.de")
        tok_dir = out / f"tokenizer-{vocab_size}"
        if (tok_dir / "src.model").exists():
            self.tokenizer = Tokenizer.load(tok_dir)
        else:
            settings = TokenizerConfig(vocab_size=vocab_size, input_sentence_size=200_000)
            self.tokenizer = Tokenizer.train(src, tgt, settings)
            self.tokenizer.save(tok_dir)
        self.pairs = TokenizedPairs.from_lists(
            self.tokenizer.encode_src(src), self.tokenizer.encode_tgt(tgt), max_src_len=128,
            max_tgt_len=127,
        )  # fmt: skip

    def loader(self, max_tokens: int, seed: int, pad_to_multiple: int = 1) -> DataLoader:
        """Shuffled token-budget batches, the order fixed by `seed` (same for every run)."""
        sampler = TokenBudgetBatchSampler(
            self.pairs.src_lengths(), self.pairs.tgt_lengths(), max_tokens=max_tokens,
            shuffle=True, seed=seed, rank=0, world_size=1,
        )  # fmt: skip
        fn = functools.partial(collate, pad_to_multiple=pad_to_multiple)
        return DataLoader(self.pairs, batch_sampler=sampler, collate_fn=fn)  # no workers


# -- training --------------------------------------------------------------------------------
class StepLog(L.Callback):
    """Per optimizer step: the loss, the target tokens and the clock; stops the run at `stop_at`
    (time.monotonic), so no run outlives the deadline."""

    def __init__(self, stop_at: float) -> None:
        self.stop_at = stop_at
        self.losses: list[float] = []
        self.tokens: list[float] = []
        self.times: list[float] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, *_: Any
    ) -> None:
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            self.losses.append(float(loss))  # float(): waits for the GPU, so the clock is fair
        self.tokens.append(float(batch["tgt_lengths"].sum()))
        self.times.append(time.perf_counter())
        if time.monotonic() > self.stop_at:
            trainer.should_stop = True

    def overhead_s(self, start: float) -> float:
        """Seconds since `start` (perf_counter) beyond the steps at their median pace: the
        start-up and, for flex, compiling its kernels."""
        if not self.times:
            return time.perf_counter() - start
        steps = [b - a for a, b in zip([start, *self.times[:-1]], self.times, strict=True)]
        pace = sorted(steps)[len(steps) // 2]
        return max(0.0, self.times[-1] - start - pace * len(steps))

    def tokens_per_s(self, skip: int) -> float:
        """Target tokens/s over the steps after the first `skip` (compilation, warm-up)."""
        if len(self.times) <= skip + 1:
            return float("nan")
        return sum(self.tokens[skip + 1 :]) / (self.times[-1] - self.times[skip])


def model_config(
    corpus: Corpus, size: dict[str, Any], backend: str, dropout: bool
) -> dict[str, Any]:
    config = {
        **size,
        "src_vocab_size": corpus.tokenizer.src_vocab_size,
        "tgt_vocab_size": corpus.tokenizer.tgt_vocab_size,
        "attention": {"encoder_self": backend, "decoder_self": backend, "cross": backend},
    }
    if not dropout:  # runs of different kernels then draw no random numbers
        config.update(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return config


def train_run(
    corpus: Corpus,
    size: dict[str, Any],
    backend: str,
    precision: str,
    *,
    args: argparse.Namespace,
    deadline: Deadline,
    steps: int = -1,
    max_time_s: float | None = None,
    max_tokens: int | None = None,
    module_node: dict[str, Any] | None = None,
    dropout: bool = False,
    ckpt: Path | None = None,
    strategy: Any = "auto",
    cap_s: float | None = None,
) -> StepLog:
    """Train from seed 0 for `steps` optimizer steps (or `max_time_s` seconds); the log of
    its steps. Stops early at the deadline, and a step-counted run after `cap_s` seconds
    (default `--run-cap-s`); the caller compares the steps done."""
    L.seed_everything(0, verbose=False)
    node = module_node or TRAIN_MODULE
    warmup = max(1, steps // 4) if steps > 0 else node["scheduler"]["warmup_steps"]
    module = TranslationModule(
        model_config(corpus, size, backend, dropout), corpus.tokenizer, "en", "de",
        optimizer=factory(node["optimizer"]),
        scheduler=factory(node["scheduler"], warmup_steps=warmup, **({} if max_time_s else {"name": "inverse_sqrt"})),
        label_smoothing=node.get("label_smoothing", 0.1), seed=0,
    )  # fmt: skip
    plugins: list[Any] = []
    trainer_precision: str | None = precision
    if precision == "transformer-engine":
        plugins.append(fp8_precision_plugin(precision))
        trainer_precision = None
    # every run stops itself at the deadline (less a margin); a step-counted run also at
    # its cap, so one slow kernel cannot eat the rows after it
    cap = deadline.left() - args.margin_s
    if steps > 0:
        cap = min(cap, args.run_cap_s if cap_s is None else cap_s)
    log = StepLog(stop_at=time.monotonic() + max(1.0, cap))
    max_time = None if max_time_s is None else {"seconds": max_time_s}
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=1, strategy=strategy, precision=trainer_precision,
        plugins=plugins, max_steps=steps, max_time=max_time, max_epochs=-1 if max_time else None,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, callbacks=[log],
        gradient_clip_val=1.0,
    )  # fmt: skip
    pad = pad_multiple_for(precision)
    loader = corpus.loader(max_tokens or args.max_tokens, seed=0, pad_to_multiple=pad)
    trainer.fit(module, train_dataloaders=loader)
    if ckpt is not None:
        trainer.save_checkpoint(ckpt)
    return log


def final_loss(losses: list[float]) -> float:
    """Mean of the last 20 steps' losses (less noisy than the very last one)."""
    tail = losses[-20:]
    return sum(tail) / len(tail) if tail else float("nan")


def unavailable(backend: str) -> tuple[str, str] | None:
    """None when `backend` can run here; else ("not installed", why) or ("not usable", why).

    A kernel package is imported, with every name its backend calls (`BackendSupport.
    requires`): a package that `find_spec` finds can still fail to import or lack them.
    """
    if backend == "flex" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return "not installed", f"torch {torch.__version__} has no flex_attention"
    if backend not in PACKAGES:
        return None
    problem = get_backend_class(backend).unavailable()
    if problem is not None and problem[0] == "not installed":
        return "not installed", f"{problem[1]} not installed"
    return problem


@dataclasses.dataclass
class State:
    """One run: its settings, rows and deadline, and what earlier rows hand to later ones."""

    args: argparse.Namespace
    rows: Rows
    deadline: Deadline
    corpus: Corpus | None = None  # set by the corpus row
    bf16: dict[str, StepLog] = dataclasses.field(default_factory=dict)  # parity logs (speed)
    ref: dict[str, float] = dataclasses.field(default_factory=dict)  # sdpa loss per precision
    peak: float | None = None  # FLOP/s of the matmul peak row
    flex_compile_left: float = 0.0  # what is left of --flex-compile-s

    def need_corpus(self) -> Corpus:
        """The corpus of the corpus row, or an error saying that row failed."""
        if self.corpus is None:
            raise RuntimeError("no corpus: the corpus row failed (see its row)")
        return self.corpus
