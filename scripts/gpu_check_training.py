"""The rows of `scripts/gpu_check.py` that train and decode: the matmul peak, Transformer-base
throughput, the CPU recipe's BLEU, and FSDP / FP8 each in its own process.

Each row function returns (result, status); `Rows.measure` guards it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_common import (
    RECIPE,
    TRAIN_MODULE,
    Corpus,
    Deadline,
    State,
    final_loss,
    merge,
    model_config,
    train_run,
    unavailable,
)

from litmt.decoding.translator import Translator
from litmt.metrics import corpus_scores
from litmt.models import Seq2SeqTransformer, TransformerConfig

Row = tuple[str, str]  # (result, status)
SCRIPT = Path(__file__).with_name("gpu_check.py")  # the workers run it with --worker
WORKER_CHECKS = {"fsdp": "FSDP, 1 GPU", "fp8": "FP8 (transformer-engine)"}


# -- 3. matmul peak and Transformer-base throughput ------------------------------------------
def matmul_peak(st: State) -> Row:
    """FLOP/s of a plain square matmul in bf16 (fp32 in the dry run); kept in `st.peak`."""
    n, reps = st.args.matmul_n, st.args.matmul_reps
    device = "cuda" if st.args.accelerator == "gpu" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    st.peak = 2 * n**3 * reps / (time.perf_counter() - t0)
    return f"{st.peak / 1e12:.1f} TFLOP/s", "ok"


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


def throughput(st: State) -> Row:
    """Transformer-base (conf/model/base.yaml), bf16 autocast, sdpa: tokens/s and MFU."""
    args = st.args
    if st.deadline.left() < args.margin_s + 10:
        return "not run: the deadline was reached", "FAIL"
    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    corpus = st.need_corpus()
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
        return "no steps measured (too few batches)", "FAIL"
    rate = flops / elapsed
    mfu = "no matmul peak" if not st.peak else f"MFU {100 * rate / st.peak:.1f} %"
    result = f"{tokens / elapsed:,.0f} target tok/s, {rate / 1e12:.1f} TFLOP/s, {mfu}"
    return result + (" of the measured matmul peak" if st.peak else ""), "ok"


# -- 5. the CPU recipe's model: 2 minutes, then beam 5 on test2016 ---------------------------
def recipe_bleu(st: State) -> Row:
    args = st.args
    if st.deadline.left() < args.bleu_train_s + args.margin_s + 10:
        return "not run: the deadline was reached", "FAIL"
    corpus, ckpt = st.need_corpus(), args.out / "recipe.ckpt"
    log = train_run(
        corpus, args.recipe_size, "sdpa", "bf16-mixed", args=args, deadline=st.deadline,
        max_time_s=args.bleu_train_s, max_tokens=args.recipe_max_tokens,
        module_node=merge(TRAIN_MODULE, RECIPE["module"]), dropout=True, ckpt=ckpt,
    )  # fmt: skip
    src = corpus.test_src
    device = "cuda" if args.accelerator == "gpu" else "cpu"
    translator = Translator.from_checkpoint(ckpt, device=device)
    t0 = time.perf_counter()
    hyps = translator.translate(src, beam_size=5)
    secs = time.perf_counter() - t0
    bleu = corpus_scores(hyps, corpus.test_ref, metrics=("bleu",))["bleu"].score
    result = (
        f"{len(log.losses)} steps, loss {final_loss(log.losses):.3f}; BLEU {bleu:.2f}, "
        f"{len(src)} sentences, {len(src) / secs:.0f} sent/s"
    )
    ok = len(hyps) == len(src) and (args.dry_run or any(h.strip() for h in hyps))
    return result, "ok" if ok else "FAIL"


# -- 6. FSDP and FP8, each in its own process (the process group; TE's global state) ---------
def worker(kind: str, args: argparse.Namespace) -> None:
    """The body of `gpu_check.py --worker KIND`: train, print the losses and peak as JSON."""
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


def run_worker(st: State, kind: str) -> Row:
    """`kind` ("fsdp" or "fp8") in its own process, within the time left."""
    args = st.args
    if args.accelerator != "gpu":
        return "not in the dry run (needs CUDA)", "skipped"
    problem = unavailable("te") if kind == "fp8" else None
    if problem is not None:
        status, why = problem
        return (why, status) if status == "not installed" else (f"not usable: {why}", "skipped")
    left = st.deadline.left() - args.margin_s
    if left < 30:
        return "not run: the deadline was reached", "FAIL"
    cmd = [sys.executable, str(SCRIPT), "--worker", kind, "--out", str(args.out), "--data",
           str(args.data), "--deadline-s", str(left - 5)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, timeout=left, text=True, capture_output=True)
    except subprocess.TimeoutExpired:
        return f"timed out after {left:.0f}s", "FAIL"
    (args.out / f"{kind}.log").write_text(proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"exit {proc.returncode}: {last[:150]} ({kind}.log)", "FAIL"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    losses = report["losses"]
    ok = len(losses) == args.worker_steps and math.isfinite(losses[-1]) and losses[-1] < losses[0]
    result = (
        f"loss {losses[0]:.3f} -> {final_loss(losses):.3f} in {len(losses)} steps, "
        f"checkpoint saved; worker peak {report['peak'] / 2**30:.1f} GiB"
    )
    return result, "ok" if ok else "FAIL"
