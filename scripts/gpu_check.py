"""The measurements of `scripts/gpu_check.sh`, most valuable first, without Hydra.

The GPU image has CUDA PyTorch, Lightning (with PyYAML), sentencepiece and sacreBLEU, and no
hydra-core, omegaconf, `datasets` or wandb. So this script imports none of them: it reads the
Multi30k text files into litmt's `TokenizedPairs`, batches them with `TokenBudgetBatchSampler`
and `collate`, builds `TranslationModule` and a Lightning `Trainer` directly, and reads the
model sizes, the optimiser and the CPU recipe from `conf/` with PyYAML (no values restated).

    PYTHONPATH=src python3 scripts/gpu_check.py --out OUT [--data data/multi30k] [--deadline-s 330]
    PYTHONPATH=src python3 scripts/gpu_check.py --dry-run --out OUT   # CPU, toy corpus, seconds

Rows, in this order (a deadline cuts the least valuable):
  1. environment; flash/xformers/te: version or "not installed" (not a pass);
  2. loss parity: sdpa (the reference), math, flex (and flash/xformers/te where installed) in
     bf16-mixed and 16-mixed: `--steps` steps from one seed on the same batches, no dropout;
     the mean loss of the last 20 steps within `LOSS_TOLERANCE` (2 %) of sdpa's;
  3. the bf16 matmul peak (a plain 8192^3 matmul), then Transformer-base bf16 training target
     tokens/s and MFU against that measured peak;
  4. flex against sdpa speed: steady-state tokens/s of the bf16 parity runs (no extra run);
  5. the CPU recipe's model (conf/experiment/multi30k_cpu.yaml) trained `--bleu-train-s`
     seconds in bf16, then beam 5 on test2016: BLEU and sentences/s;
  6. one-GPU FSDP (and FP8 where Transformer Engine is installed), each in its own process.
Each row also gives the peak CUDA memory of its step. Each row is appended to
OUT/gpu_check_rows.jsonl as soon as it is measured; the row being measured is named in
OUT/gpu_check_current.txt (so a killed run says where it stopped). Missing data, a run cut by
the deadline and a parity miss are FAIL rows; the exit status is 1 when any row failed.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from torch.utils.data import DataLoader

from litmt.data.collate import TokenizedPairs, collate
from litmt.data.sampler import TokenBudgetBatchSampler
from litmt.data.text import read_text_file
from litmt.data.tokenizer import Tokenizer, TokenizerSettings
from litmt.decoding.translator import Translator
from litmt.metrics import corpus_scores
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.runtime.precision import fp8_precision_plugin, pad_multiple_for
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


# -- rows ------------------------------------------------------------------------------------
class Rows:
    """Appends rows to OUT/gpu_check_rows.jsonl as each is measured, with the peak CUDA
    memory since `start`; OUT/gpu_check_current.txt names the row being measured."""

    def __init__(self, out: Path) -> None:
        self.path, self.current = out / "gpu_check_rows.jsonl", out / "gpu_check_current.txt"
        self.failed = 0

    def start(self, check: str, setting: str) -> None:
        self.current.write_text(f"{check} | {setting}\n", encoding="utf-8")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def add(self, check: str, setting: str, result: str, status: str) -> None:
        mem = (
            f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
            if torch.cuda.is_available()
            else "-"
        )
        row = {
            "check": check,
            "setting": setting,
            "result": result,
            "status": status,
            "peak_mem": mem,
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.current.unlink(missing_ok=True)
        self.failed += status == "FAIL"
        print(f"[gpu_check] {check} | {setting} | {result} | {status} | {mem}", flush=True)


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
            settings = TokenizerSettings(vocab_size=vocab_size, input_sentence_size=200_000)
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
) -> StepLog:
    """Train from seed 0 for `steps` optimizer steps (or `max_time_s` seconds); the log of
    its steps. Stops early at the deadline (the caller compares the steps done)."""
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
    # --run-cap-s, so one slow kernel cannot eat the rows after it
    cap = deadline.left() - args.margin_s
    if steps > 0:
        cap = min(cap, args.run_cap_s)
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


def missing(backend: str) -> str | None:
    """None when `backend` can run here, else what is missing."""
    if backend == "flex" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"torch {torch.__version__} has no flex_attention"
    pkg = PACKAGES.get(backend)
    if pkg is not None and importlib.util.find_spec(pkg) is None:
        return "not installed"
    return None


# -- 1. environment --------------------------------------------------------------------------
def environment(args: argparse.Namespace, rows: Rows) -> None:
    rows.start("environment", "-")
    if args.accelerator == "gpu":
        cap = "sm{}{}".format(*torch.cuda.get_device_capability())
        where = f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()} {cap}"
    else:
        where = "CPU (dry run)"
    rows.add("environment", "-", f"torch {torch.__version__}, {where}", "ok")
    for pkg in PACKAGES.values():
        rows.start("kernel package", pkg)
        if importlib.util.find_spec(pkg) is None:
            rows.add("kernel package", pkg, "not installed: its rows are not run", "not installed")
            continue
        try:
            version = importlib.metadata.version(DISTRIBUTIONS.get(pkg, pkg))
        except importlib.metadata.PackageNotFoundError:
            version = "installed"
        rows.add("kernel package", pkg, version, "ok")


# -- 2. parity -------------------------------------------------------------------------------
def parity(
    corpus: Corpus, args: argparse.Namespace, rows: Rows, deadline: Deadline
) -> dict[str, StepLog]:
    """sdpa, math, flex, ... per precision; returns the bf16 logs by backend (for speed)."""
    bf16: dict[str, StepLog] = {}
    precisions = ("bf16-mixed", "16-mixed") if args.accelerator == "gpu" else ("bf16-mixed",)
    for precision in precisions:
        ref: float | None = None
        for backend in args.backends:
            setting = f"{backend} {precision}, {args.steps} steps"
            why = missing(backend)
            if why is not None:
                rows.start("loss parity", setting)
                rows.add("loss parity", setting, why, "not installed")
                continue
            if deadline.left() < args.margin_s + 5:
                rows.start("loss parity", setting)
                rows.add("loss parity", setting, "not run: the deadline was reached", "FAIL")
                continue
            rows.start("loss parity", setting)
            t0 = time.perf_counter()
            log = train_run(corpus, args.size, backend, precision, args=args, deadline=deadline,
                            steps=args.steps)  # fmt: skip
            secs, loss = time.perf_counter() - t0, final_loss(log.losses)
            if precision == "bf16-mixed":
                bf16[backend] = log
            done = len(log.losses)
            if done < args.steps or not math.isfinite(loss):
                result = (
                    f"{done}/{args.steps} steps in {secs:.0f}s (stopped by --run-cap-s or the "
                    f"deadline), last loss {loss:.4f}"
                )
                rows.add("loss parity", setting, result, "FAIL")
            elif backend == "sdpa":
                ref = loss
                rows.add("loss parity", setting, f"final loss {loss:.4f} ({secs:.0f}s)", "ref")
            elif ref is None:
                rows.add(
                    "loss parity", setting, f"final loss {loss:.4f}; no sdpa reference", "FAIL"
                )
            else:
                rel = abs(loss - ref) / ref
                result = f"final loss {loss:.4f} vs sdpa {ref:.4f}: {100 * rel:.2f} % (tolerance {100 * LOSS_TOLERANCE:.0f} %, {secs:.0f}s)"
                rows.add("loss parity", setting, result, "ok" if rel <= LOSS_TOLERANCE else "FAIL")
    return bf16


# -- 3. matmul peak and Transformer-base throughput ------------------------------------------
def matmul_peak(args: argparse.Namespace, rows: Rows) -> float:
    """FLOP/s of a plain square matmul in bf16 (fp32 in the dry run)."""
    n, reps = args.matmul_n, args.matmul_reps
    device = "cuda" if args.accelerator == "gpu" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    setting = f"{str(dtype)[6:]} {n}x{n}x{n}, {reps} reps"
    rows.start("matmul peak", setting)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    peak = 2 * n**3 * reps / (time.perf_counter() - t0)
    rows.add("matmul peak", setting, f"{peak / 1e12:.1f} TFLOP/s", "ok")
    return peak


def train_flops(config: TransformerConfig, batch: dict[str, Any]) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward) on real tokens.

    Multiply-adds per token of every projection it passes (encoder layers on source tokens;
    decoder self/FFN and the output projection on target tokens; cross-attention K/V on
    source, Q/O on target), plus the attention products QK^T and PV (2 x Tq x Tk x d per
    layer and sentence; half of it for causal self-attention); 2 FLOPs per multiply-add.
    """
    d, v = config.d_model, config.tgt_vocab_size
    ffn = (3 if config.activation == "swiglu" else 2) * d * config.d_ff
    s_len, t_len = batch["src_lengths"].float(), batch["tgt_lengths"].float()
    s_tok, t_tok = float(s_len.sum()), float(t_len.sum())
    enc = config.n_encoder_layers * (s_tok * (4 * d * d + ffn) + 2 * d * float((s_len**2).sum()))
    dec = config.n_decoder_layers * (
        t_tok * (6 * d * d + ffn) + s_tok * 2 * d * d
        + 2 * d * float((t_len**2).sum() / 2 + (t_len * s_len).sum())
    )  # fmt: skip
    return 3 * 2 * (enc + dec + t_tok * d * v)


def throughput(
    corpus: Corpus, args: argparse.Namespace, rows: Rows, deadline: Deadline, peak: float
) -> None:
    """Transformer-base (conf/model/base.yaml), bf16 autocast, sdpa: tokens/s and MFU."""
    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    setting = (
        f"{args.base_name}, bf16, sdpa, max_tokens {args.base_max_tokens}, {args.base_steps} steps"
    )
    rows.start("throughput", setting)
    if deadline.left() < args.margin_s + 10:
        rows.add("throughput", setting, "not run: the deadline was reached", "FAIL")
        return
    config = TransformerConfig.from_dict(model_config(corpus, args.base_size, "sdpa", dropout=True))
    model = Seq2SeqTransformer(config).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    loader = corpus.loader(args.base_max_tokens, seed=1, pad_to_multiple=8)
    warm = 3
    batches = [b for _, b in zip(range(args.base_steps + warm), loader, strict=False)]
    tokens = flops = elapsed = 0.0
    for i, batch in enumerate(batches):
        src, tgt_in, tgt_out = (batch[k].to(device) for k in ("src", "tgt_in", "tgt_out"))
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(src, tgt_in)  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=0
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warm:  # the first steps warm the allocator and cuBLAS
            elapsed += time.perf_counter() - t0
            tokens += float(batch["tgt_lengths"].sum())
            flops += train_flops(config, batch)
    if elapsed == 0:
        rows.add("throughput", setting, "no steps measured (too few batches)", "FAIL")
        return
    rate = flops / elapsed
    result = (
        f"{tokens / elapsed:,.0f} target tok/s, {rate / 1e12:.1f} TFLOP/s, "
        f"MFU {100 * rate / peak:.1f} % of the measured matmul peak"
    )
    rows.add("throughput", setting, result, "ok")


# -- 4. flex against sdpa --------------------------------------------------------------------
def flex_speed(bf16: dict[str, StepLog], args: argparse.Namespace, rows: Rows) -> None:
    setting = f"bf16-mixed parity runs, steps after the first {args.speed_skip}"
    rows.start("flex vs sdpa speed", setting)
    why = missing("flex")
    if "flex" not in args.backends:
        rows.add(
            "flex vs sdpa speed",
            setting,
            "not in the dry run (flex compiles for minutes on a CPU)",
            "skipped",
        )
    elif why is not None:
        rows.add("flex vs sdpa speed", setting, why, "FAIL")
    elif "flex" not in bf16 or "sdpa" not in bf16:
        rows.add("flex vs sdpa speed", setting, "no flex or sdpa bf16 run", "FAIL")
    else:
        flex, sdpa = (bf16[k].tokens_per_s(args.speed_skip) for k in ("flex", "sdpa"))
        ok = math.isfinite(flex) and math.isfinite(sdpa)
        result = f"flex {flex:,.0f} vs sdpa {sdpa:,.0f} target tok/s ({flex / sdpa:.2f}x)"
        rows.add("flex vs sdpa speed", setting, result, "ok" if ok else "FAIL")


# -- 5. the CPU recipe's model: 2 minutes, then beam 5 on test2016 ---------------------------
def recipe_bleu(corpus: Corpus, args: argparse.Namespace, rows: Rows, deadline: Deadline) -> None:
    check = "recipe BLEU"
    setting = f"multi30k_cpu model, bf16-mixed, {args.bleu_train_s:.0f}s, beam 5 on test2016"
    rows.start(check, setting)
    if deadline.left() < args.bleu_train_s + args.margin_s + 10:
        rows.add(check, setting, "not run: the deadline was reached", "FAIL")
        return
    ckpt = args.out / "recipe.ckpt"
    log = train_run(
        corpus, args.recipe_size, "sdpa", "bf16-mixed", args=args, deadline=deadline,
        max_time_s=args.bleu_train_s, max_tokens=args.recipe_max_tokens,
        module_node=merge(TRAIN_MODULE, RECIPE["module"]), dropout=True, ckpt=ckpt,
    )  # fmt: skip
    src = corpus.test_src
    translator = Translator.from_checkpoint(
        ckpt, device="cuda" if args.accelerator == "gpu" else "cpu"
    )
    t0 = time.perf_counter()
    hyps = translator.translate(src, beam_size=5)
    secs = time.perf_counter() - t0
    bleu = corpus_scores(hyps, corpus.test_ref, metrics=("bleu",))["bleu"].score
    result = (
        f"{len(log.losses)} steps, loss {final_loss(log.losses):.3f}; BLEU {bleu:.2f}, "
        f"{len(src)} sentences, {len(src) / secs:.0f} sent/s"
    )
    ok = len(hyps) == len(src) and (args.dry_run or any(h.strip() for h in hyps))
    rows.add(check, setting, result, "ok" if ok else "FAIL")


# -- 6. FSDP and FP8, each in its own process (the process group; TE's global state) ---------
def worker(kind: str, args: argparse.Namespace) -> None:
    corpus = Corpus(args.data, args.out, args.vocab_size)
    deadline = Deadline(args.deadline_s)
    if kind == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from litmt.models.layers import DecoderLayer, EncoderLayer

        strategy: Any = FSDPStrategy(
            auto_wrap_policy=ModuleWrapPolicy({EncoderLayer, DecoderLayer}), state_dict_type="full"
        )
        precision = "bf16-mixed"
    else:
        strategy, precision = "auto", "transformer-engine"
    log = train_run(corpus, args.size, "sdpa", precision, args=args, deadline=deadline,
                    steps=args.worker_steps, strategy=strategy, ckpt=args.out / f"{kind}.ckpt")  # fmt: skip
    print(json.dumps({"losses": log.losses, "peak": torch.cuda.max_memory_allocated()}))


def run_worker(kind: str, args: argparse.Namespace, rows: Rows, deadline: Deadline) -> None:
    check = {"fsdp": "FSDP, 1 GPU", "fp8": "FP8 (transformer-engine)"}[kind]
    setting = f"{'bf16-mixed' if kind == 'fsdp' else 'fp8'}, {args.worker_steps} steps"
    rows.start(check, setting)
    if args.accelerator != "gpu":
        rows.add(check, setting, "not in the dry run (needs CUDA)", "skipped")
        return
    if kind == "fp8" and importlib.util.find_spec("transformer_engine") is None:
        rows.add(check, setting, "transformer_engine not installed", "not installed")
        return
    left = deadline.left() - args.margin_s
    if left < 30:
        rows.add(check, setting, "not run: the deadline was reached", "FAIL")
        return
    cmd = [sys.executable, __file__, "--worker", kind, "--out", str(args.out), "--data",
           str(args.data), "--deadline-s", str(left - 5)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, timeout=left, text=True, capture_output=True)
    except subprocess.TimeoutExpired:
        rows.add(check, setting, f"timed out after {left:.0f}s", "FAIL")
        return
    (args.out / f"{kind}.log").write_text(proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        rows.add(check, setting, f"exit {proc.returncode}: {last[:150]} ({kind}.log)", "FAIL")
        return
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    losses = report["losses"]
    ok = len(losses) == args.worker_steps and math.isfinite(losses[-1]) and losses[-1] < losses[0]
    result = (
        f"loss {losses[0]:.3f} -> {final_loss(losses):.3f} in {len(losses)} steps, checkpoint saved"
    )
    rows.add(
        check,
        setting,
        f"{result}; worker peak {report['peak'] / 2**30:.1f} GiB",
        "ok" if ok else "FAIL",
    )


# -- main ------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="The measurements of scripts/gpu_check.sh (see the module docstring)."
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the rows, logs, checkpoints")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "multi30k",
                   help="Multi30k train/test2016 .en/.de (default data/multi30k)")  # fmt: skip
    p.add_argument(
        "--deadline-s", type=float, default=330.0, help="wall-clock limit of this script"
    )
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of each parity run")
    p.add_argument("--run-cap-s", type=float, default=60.0,
                   help="the longest one parity run may take (then it is a FAIL)")  # fmt: skip
    p.add_argument(
        "--bleu-train-s", type=float, default=120.0, help="training time of the recipe row"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="CPU, a toy corpus, a tiny model: seconds"
    )
    p.add_argument("--worker", choices=("fp8", "fsdp"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.margin_s = 15.0  # seconds kept free before the deadline for the row and the table
    args.speed_skip = 10  # parity steps left out of the speed figure (flex compiles in them)
    args.worker_steps = 50
    args.recipe_size = merge(model_group("small"), RECIPE["model"])
    args.vocab_size = RECIPE["data"]["tokenizer"]["vocab_size"]
    args.recipe_max_tokens = RECIPE["data"]["max_tokens"]
    if args.dry_run:
        args.data = write_toy_corpus(args.out / "toy-data")
        args.accelerator, args.vocab_size, args.margin_s = "cpu", 64, 2.0
        args.size = args.base_size = args.recipe_size = {**model_group("base"), **TINY}
        args.base_name, args.max_tokens, args.base_max_tokens = "tiny", 256, 256
        args.steps, args.base_steps, args.speed_skip = min(args.steps, 3), 2, 0
        args.bleu_train_s, args.recipe_max_tokens = min(args.bleu_train_s, 2.0), 256
        args.matmul_n, args.matmul_reps, args.backends = 128, 3, ("sdpa", "math")
    else:
        args.accelerator, args.size = "gpu", model_group("small")
        args.base_size, args.base_name = model_group("base"), "base"
        args.max_tokens, args.base_max_tokens, args.base_steps = 4096, 8192, 30
        args.matmul_n, args.matmul_reps, args.backends = 8192, 20, EXACT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        worker(args.worker, args)
        return 0
    deadline = Deadline(args.deadline_s)
    rows = Rows(args.out)
    environment(args, rows)
    absent = [f for f in FILES if not (args.data / f).is_file()]
    if absent:
        rows.start("data", str(args.data))
        fix = "fill it with: bash scripts/gpu_check.sh --prepare-data"
        rows.add("data", str(args.data), f"missing {', '.join(absent)}; {fix}", "FAIL")
        matmul_peak(args, rows)
        return 1
    corpus = Corpus(args.data, args.out, args.vocab_size)
    bf16 = parity(corpus, args, rows, deadline)
    peak = matmul_peak(args, rows)
    throughput(corpus, args, rows, deadline, peak)
    flex_speed(bf16, args, rows)
    recipe_bleu(corpus, args, rows, deadline)
    run_worker("fsdp", args, rows, deadline)
    run_worker("fp8", args, rows, deadline)
    return 1 if rows.failed else 0


if __name__ == "__main__":
    sys.exit(main())
