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
import importlib
import importlib.metadata
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_common import (
    DISTRIBUTIONS,
    EXACT,
    FILES,
    LOSS_TOLERANCE,
    PACKAGES,
    RECIPE,
    ROOT,
    TINY,
    TRAIN_MODULE,
    Corpus,
    Deadline,
    Rows,
    StepLog,
    final_loss,
    merge,
    missing,
    model_config,
    model_group,
    train_run,
    write_toy_corpus,
)

from litmt.decoding.translator import Translator
from litmt.metrics import corpus_scores
from litmt.models import Seq2SeqTransformer, TransformerConfig


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
