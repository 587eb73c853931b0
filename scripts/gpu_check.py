"""The training, FP8, FSDP, throughput and decoding checks of `scripts/gpu_check.sh`.

Runs without Hydra's config tree and without `datasets` (the GPU image may lack both): the
Multi30k text files are tokenised with litmt's sentencepiece `Tokenizer` straight into
`TokenizedPairs`, batched by litmt's `TokenBudgetBatchSampler` and `collate`, and trained by
`TranslationModule` under a Lightning `Trainer`, the same objects `litmt.cli.train` composes.

    python scripts/gpu_check.py --data ../shared/data/multi30k --out OUT [--budget-s 330]
    python scripts/gpu_check.py --smoke --out OUT     # CPU, a toy corpus, a few steps

Each section appends rows (check, setting, result, status) to OUT/gpu_check_rows.jsonl; the
shell script prints them as one table. A section that cannot run (a package is missing, the
time budget is spent) writes a `skipped` row saying why.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from litmt.data.collate import TokenizedPairs, collate
from litmt.data.sampler import TokenBudgetBatchSampler
from litmt.data.text import read_text_file
from litmt.data.tokenizer import Tokenizer, TokenizerSettings
from litmt.decoding.translator import Translator
from litmt.metrics import corpus_scores
from litmt.runtime.precision import fp8_precision_plugin, pad_multiple_for
from litmt.training.module import TranslationModule

# The optimiser and LR schedule of `scripts/train.py` (conf/train.yaml `module`), defaults included
TRAIN_MODULE = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "train.yaml").module

# Kernels that compute exact attention (the approximate ones, local/sparse/linear, are not
# compared); the optional package each one needs.
EXACT = ("sdpa", "math", "flex", "flash", "xformers", "te")
PACKAGES = {"flash": "flash_attn", "xformers": "xformers", "te": "transformer_engine"}
SMALL = {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_encoder_layers": 3, "n_decoder_layers": 3}
BASE = {"d_model": 512, "n_heads": 8, "d_ff": 2048, "n_encoder_layers": 6, "n_decoder_layers": 6}
TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}
# Dense bf16 tensor-core peak, FLOP/s (NVIDIA datasheets, SXM parts), for the MFU figure.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
LOSS_TOLERANCE = 0.02  # final loss within 2 % of sdpa's


class Rows:
    """Appends result rows to a JSONL file (one table at the end, also after a crash)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, check: str, setting: str, result: str, status: str) -> None:
        row = {"check": check, "setting": setting, "result": result, "status": status}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[gpu_check] {check} | {setting} | {result} | {status}", flush=True)


class Budget:
    """Wall-clock budget shared by the sections (the whole script must fit in 8 minutes)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# -- data -----------------------------------------------------------------------------------
def toy_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Word-for-word pairs for the CPU smoke mode."""
    words = {"a": "ein", "dog": "hund", "red": "rot", "runs": "rennt", "man": "mann", "big": "groß"}
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        ws = [rng.choice(list(words)) for _ in range(rng.randint(3, 8))]
        src.append(" ".join(ws))
        tgt.append(" ".join(words[w] for w in ws))
    return src, tgt


class Corpus:
    """Multi30k (or the toy corpus), tokenised once: train pairs and the test2016 text."""

    def __init__(self, data: Path | None, out: Path, vocab_size: int) -> None:
        if data is None:
            src, tgt = toy_corpus(400)
            self.test_src, self.test_ref = toy_corpus(20, seed=1)
        else:
            src, tgt = (
                read_text_file(data / "train.en", "train.en"),
                read_text_file(data / "train.de", "train.de"),
            )
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
        # no worker processes: collating small batches is cheap, and no start-up per run
        return DataLoader(self.pairs, batch_sampler=sampler, collate_fn=fn)


# -- training -------------------------------------------------------------------------------
class LossLog(L.Callback):
    """Records `train/loss` after every optimizer step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            self.losses.append(float(loss))


def model_config(corpus: Corpus, size: dict[str, int], backend: str) -> dict[str, Any]:
    return {
        **size,
        "src_vocab_size": corpus.tokenizer.src_vocab_size,
        "tgt_vocab_size": corpus.tokenizer.tgt_vocab_size,
        "dropout": 0.0,  # no dropout: the runs of different kernels draw no random numbers
        "attention": {"encoder_self": backend, "decoder_self": backend, "cross": backend},
    }


def train_run(
    corpus: Corpus,
    backend: str,
    precision: str,
    steps: int,
    *,
    size: dict[str, int],
    accelerator: str,
    max_tokens: int,
    ckpt: Path | None = None,
    strategy: Any = "auto",
) -> list[float]:
    """Train `steps` optimizer steps from seed 0; returns the per-step losses (and saves)."""
    L.seed_everything(0, verbose=False)
    module = TranslationModule(
        model_config(corpus, size, backend), corpus.tokenizer, "en", "de",
        optimizer=hydra.utils.instantiate(TRAIN_MODULE.optimizer),  # conf/train.yaml's AdamW
        scheduler=hydra.utils.instantiate(
            TRAIN_MODULE.scheduler, name="inverse_sqrt", warmup_steps=max(1, steps // 4)
        ),
        label_smoothing=0.1, seed=0,
    )  # fmt: skip
    plugins: list[Any] = []
    trainer_precision: str | None = precision
    if precision.startswith("transformer-engine"):
        plugins.append(fp8_precision_plugin(precision))  # keeps the output projection tied
        trainer_precision = None
    losses = LossLog()
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, strategy=strategy, precision=trainer_precision,
        plugins=plugins, max_steps=steps, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False, callbacks=[losses], gradient_clip_val=1.0,
    )  # fmt: skip
    loader = corpus.loader(max_tokens, seed=0, pad_to_multiple=pad_multiple_for(precision))
    trainer.fit(module, train_dataloaders=loader)
    if ckpt is not None:
        trainer.save_checkpoint(ckpt)
    return losses.losses


def final_loss(losses: list[float]) -> float:
    """Mean of the last 20 steps' losses (less noisy than the very last one)."""
    tail = losses[-20:]
    return sum(tail) / max(1, len(tail))


def present(backend: str) -> str | None:
    """None when `backend` can run here, else what is missing."""
    if backend == "flex" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"torch {torch.__version__} has no flex_attention"
    pkg = PACKAGES.get(backend)
    if pkg is not None and importlib.util.find_spec(pkg) is None:
        return f"{pkg} not installed"
    return None


def check_backends(
    corpus: Corpus,
    args: argparse.Namespace,
    rows: Rows,
    budget: Budget,
    backends: tuple[str, ...],
    reference: dict[str, float],
) -> None:
    """Each of `backends` that is present, bf16-mixed and 16-mixed, against sdpa's final
    loss (kept in `reference` per precision); sdpa's first run saves `OUT/sdpa-bf16.ckpt`."""
    bf16_ckpt = args.out / "sdpa-bf16.ckpt"
    precisions = ("bf16-mixed", "16-mixed") if args.accelerator == "gpu" else ("32-true",)
    for backend in backends:
        missing = present(backend)
        if missing is not None:
            rows.add("loss vs sdpa", backend, missing, "skipped")
            continue
        for precision in precisions:
            setting = f"{backend} {precision}, {args.steps} steps"
            if budget.left() < 60:
                rows.add("loss vs sdpa", setting, "time budget spent", "skipped")
                continue
            t0 = time.perf_counter()
            save = bf16_ckpt if (backend, precision) == ("sdpa", precisions[0]) else None
            losses = train_run(
                corpus, backend, precision, args.steps, size=args.size,
                accelerator=args.accelerator, max_tokens=args.max_tokens, ckpt=save,
            )  # fmt: skip
            loss, secs = final_loss(losses), time.perf_counter() - t0
            if backend == "sdpa":
                reference[precision] = loss
                rows.add("loss vs sdpa", setting, f"final loss {loss:.4f} ({secs:.0f}s)", "ref")
                continue
            ref = reference.get(precision)
            if ref is None:
                rows.add("loss vs sdpa", setting, f"final loss {loss:.4f}, no sdpa run", "skipped")
                continue
            rel = abs(loss - ref) / ref
            ok = math.isfinite(loss) and rel <= LOSS_TOLERANCE
            result = f"final loss {loss:.4f} vs {ref:.4f} ({100 * rel:.2f} %, {secs:.0f}s)"
            rows.add("loss vs sdpa", setting, result, "ok" if ok else "FAIL")


# -- decoding -------------------------------------------------------------------------------
def decode_check(
    ckpt: Path,
    corpus: Corpus,
    rows: Rows,
    device: str,
    check: str,
    limit: int | None = None,
    trained: bool = True,
) -> None:
    """Translate test2016 (or its first `limit` lines) with beam 5 on `device`; BLEU + speed.
    A `trained` model must produce some non-empty translation (the smoke model need not)."""
    if not ckpt.exists():
        rows.add(check, str(ckpt.name), "no checkpoint (its training run was skipped)", "skipped")
        return
    src = corpus.test_src[:limit] if limit else corpus.test_src
    ref = corpus.test_ref[: len(src)]
    translator = Translator.from_checkpoint(ckpt, device=device)
    t0 = time.perf_counter()
    hyps = translator.translate(src, beam_size=5)
    secs = time.perf_counter() - t0
    bleu = corpus_scores(hyps, ref, metrics=("bleu",))["bleu"].score
    empty = sum(1 for h in hyps if not h.strip())
    autocast = str(translator.autocast).replace("torch.", "") if translator.autocast else "fp32"
    result = (
        f"{len(src)} sentences, BLEU {bleu:.2f}, {len(src) / secs:.0f} sent/s, "
        f"{autocast}, attention={translator.model.config.attention.encoder_self}"
    )
    ok = len(hyps) == len(src) and (empty < len(src) or not trained)
    rows.add(check, f"beam 5 on {device}", result, "ok" if ok else "FAIL")


# -- throughput -----------------------------------------------------------------------------
def train_flops(model: torch.nn.Module, batch: dict[str, Any]) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward) on real tokens.

    Forward: 2 FLOPs per multiply-add of every projection on every token it sees (encoder
    layers on source tokens; decoder self/FFN and the output projection on target tokens;
    cross-attention's K/V on source tokens, Q/O on target tokens) plus the attention
    products QK^T and PV (2 x 2 x Tq x Tk x d per layer and sentence; half of it for the
    causal decoder self-attention). The sums below count multiply-adds.
    """
    c = model.config
    d, ff, v = c.d_model, c.d_ff, c.tgt_vocab_size
    ffn = (3 if c.activation == "swiglu" else 2) * d * ff
    s_tok = float(batch["src_lengths"].sum())
    t_tok = float(batch["tgt_lengths"].sum())
    s_len = batch["src_lengths"].float()
    t_len = batch["tgt_lengths"].float()
    enc = c.n_encoder_layers * (s_tok * (4 * d * d + ffn) + 2 * d * float((s_len**2).sum()))
    dec = c.n_decoder_layers * (
        t_tok * (4 * d * d + 2 * d * d + ffn)
        + s_tok * 2 * d * d
        + 2 * d * float((t_len**2).sum() / 2 + (t_len * s_len).sum())
    )
    out = t_tok * d * v
    return 3 * 2 * (enc + dec + out)


def throughput_check(corpus: Corpus, args: argparse.Namespace, rows: Rows) -> None:
    """Transformer-base, bf16 autocast, sdpa: target tokens/s and model FLOPs utilisation."""
    from litmt.models import Seq2SeqTransformer, TransformerConfig

    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    cfg = TransformerConfig.from_dict(model_config(corpus, args.base_size, "sdpa"))
    model = Seq2SeqTransformer(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    loader = corpus.loader(args.base_max_tokens, seed=1)
    batches = [b for _, b in zip(range(args.base_steps + 3), loader, strict=False)]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokens, flops, elapsed = 0.0, 0.0, 0.0
    for i, batch in enumerate(batches):
        src, tgt_in, tgt_out = (batch[k].to(device) for k in ("src", "tgt_in", "tgt_out"))
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            logits = model(src, tgt_in)  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=0
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:  # the first steps warm the allocator and cuBLAS
            elapsed += time.perf_counter() - t0
            tokens += float(batch["tgt_lengths"].sum())
            flops += train_flops(model, batch)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((p for k, p in PEAK_BF16.items() if k in name), None)
    mfu = f", MFU {100 * flops / elapsed / peak:.1f} % of {peak / 1e12:.0f} TFLOP/s" if peak else ""
    result = f"{tokens / elapsed:,.0f} target tok/s, {flops / elapsed / 1e12:.1f} TFLOP/s{mfu}"
    setting = f"base, {str(dtype)[6:]}, max_tokens {args.base_max_tokens}, {len(batches) - 3} steps, {name}"
    rows.add("throughput", setting, result, "ok")


# -- FP8 and FSDP in their own processes (TE's global state; FSDP's process group) -----------
def worker(kind: str, args: argparse.Namespace) -> None:
    corpus = Corpus(args.data, args.out, args.vocab_size)
    rows = Rows(args.out / "gpu_check_rows.jsonl")
    if kind == "fp8":
        ckpt = args.out / "fp8.ckpt"
        losses = train_run(
            corpus, "sdpa", "transformer-engine", args.fp8_steps, size=args.size,
            accelerator="gpu", max_tokens=args.max_tokens, ckpt=ckpt,
        )  # fmt: skip
        ok = bool(losses) and math.isfinite(losses[-1]) and losses[-1] < losses[0]
        result = f"loss {losses[0]:.3f} -> {final_loss(losses):.3f}, tied output kept"
        rows.add(
            "FP8 (transformer-engine)", f"{args.fp8_steps} steps", result, "ok" if ok else "FAIL"
        )
        decode_check(ckpt, corpus, rows, "cuda", "FP8 checkpoint reload + translate", limit=200)
    elif kind == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from litmt.models.layers import DecoderLayer, EncoderLayer

        strategy = FSDPStrategy(
            auto_wrap_policy=ModuleWrapPolicy({EncoderLayer, DecoderLayer}),
            state_dict_type="full",
        )
        ckpt = args.out / "fsdp.ckpt"
        losses = train_run(
            corpus, "sdpa", "bf16-mixed", args.fsdp_steps, size=args.size, accelerator="gpu",
            max_tokens=args.max_tokens, ckpt=ckpt, strategy=strategy,
        )  # fmt: skip
        ok = bool(losses) and math.isfinite(losses[-1]) and losses[-1] < losses[0]
        result = f"loss {losses[0]:.3f} -> {final_loss(losses):.3f}, full checkpoint saved"
        rows.add(
            "FSDP, 1 GPU", f"bf16-mixed, {args.fsdp_steps} steps", result, "ok" if ok else "FAIL"
        )


def run_worker(kind: str, argv: list[str], rows: Rows, budget: Budget, check: str) -> None:
    if budget.left() < 60:
        rows.add(check, kind, "time budget spent", "skipped")
        return
    cmd = [sys.executable, __file__, "--worker", kind, *argv]
    try:
        proc = subprocess.run(cmd, timeout=max(60.0, budget.left() - 30), text=True,
                              capture_output=True)  # fmt: skip
    except subprocess.TimeoutExpired:
        rows.add(check, kind, "timed out", "FAIL")
        return
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        rows.add(check, kind, f"exit {proc.returncode}: {last[:150]}", "FAIL")
        (Path(argv[argv.index("--out") + 1]) / f"{kind}.log").write_text(proc.stderr)


# -- main -----------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget")
    p.add_argument("--steps", type=int, default=200, help="steps of each backend run")
    p.add_argument("--smoke", action="store_true", help="CPU, toy corpus, tiny model")
    p.add_argument("--worker", choices=("fp8", "fsdp"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.data, args.accelerator, args.vocab_size = None, "cpu", 64
        args.size, args.base_size, args.max_tokens, args.base_max_tokens = TINY, TINY, 256, 256
        args.base_steps, args.fp8_steps, args.fsdp_steps = 2, 2, 2
        args.steps, args.backends = min(args.steps, 3), ("sdpa", "math")
    else:
        args.accelerator, args.vocab_size = "gpu", 8000
        args.size, args.base_size, args.max_tokens, args.base_max_tokens = SMALL, BASE, 4096, 8192
        args.base_steps, args.fp8_steps, args.fsdp_steps = 30, 100, 50
        args.backends = EXACT
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        worker(args.worker, args)
        return 0
    budget = Budget(args.budget_s)
    rows = Rows(args.out / "gpu_check_rows.jsonl")
    if args.data is not None and not (args.data / "train.en").exists():
        rows.add("Multi30k runs", str(args.data), "no train.en there; pass --data DIR", "skipped")
        return 0
    corpus = Corpus(args.data, args.out, args.vocab_size)
    # flex compiles per shape bucket and dtype: it runs last, after every other section
    reference: dict[str, float] = {}
    check_backends(corpus, args, rows, budget, tuple(b for b in args.backends if b != "flex"),
                   reference)  # fmt: skip
    device = "cuda" if args.accelerator == "gpu" else "cpu"
    if budget.left() > 30:
        decode_check(args.out / "sdpa-bf16.ckpt", corpus, rows, device,
                     "decode test2016 (bf16-trained)", trained=not args.smoke)  # fmt: skip
    if budget.left() > 30:
        throughput_check(corpus, args, rows)
    if not args.smoke:
        run_gpu_workers(args, rows, budget)
    check_backends(corpus, args, rows, budget, tuple(b for b in args.backends if b == "flex"),
                   reference)  # fmt: skip
    return 0


def run_gpu_workers(args: argparse.Namespace, rows: Rows, budget: Budget) -> None:
    """FP8 (where Transformer Engine is installed) and FSDP, each in its own process."""
    passthrough = ["--out", str(args.out), "--data", str(args.data)]
    if importlib.util.find_spec("transformer_engine") is None:
        rows.add("FP8 (transformer-engine)", "-", "transformer_engine not installed", "skipped")
    else:
        run_worker("fp8", passthrough, rows, budget, "FP8 (transformer-engine)")
    run_worker("fsdp", passthrough, rows, budget, "FSDP, 1 GPU")


if __name__ == "__main__":
    sys.exit(main())
