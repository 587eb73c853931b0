"""Per-step decode time as the decoded length grows, per decoder self-attention kernel.

    python -m benchmarks.benchmark_decode                 # sdpa, local (window 64), linear
    python -m benchmarks.benchmark_decode --smoke         # a tiny model, seconds (the test uses it)

A small model (256 wide, 3+3 layers, 4 heads, 8000-piece vocabulary) decodes one sentence
(B = 1) for a forced number of steps: every step feeds a fixed random token, so no search
logic and no eos end it. Only the decoder self-attention kernel changes:

- ``sdpa`` keeps every K/V (`KVCache`): a step attends over all t positions, O(t);
- ``local`` (window 64) keeps the last 64 (`WindowCache`): O(window);
- ``linear`` keeps its running sums (`LinearState`): O(1) in t.

The table reports, at each length L, the mean time of the `--window` steps that end at L
(milliseconds per step), and the ratio between the last and the first length. Run it on a
quiet machine: timings of a loaded machine mean little.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from litmt.models import Seq2SeqTransformer, TransformerConfig

KERNELS = {  # decoder self-attention backend: (name, options)
    "sdpa": ("sdpa", {}),
    "local": ("local", {"window": 64}),
    "linear": ("linear", {}),
}


@dataclass
class Setup:
    """Model size and lengths of one run."""

    model: dict[str, Any]  # TransformerConfig fields
    lengths: tuple[int, ...]  # decoded lengths reported
    window: int  # local attention window
    steps_per_point: int  # steps averaged at each length


def model_size(width: int, heads: int, layers: int, vocab: int) -> dict[str, Any]:
    """TransformerConfig fields of a model: FFN 4x wide, `layers` + `layers`, no dropout."""
    return dict(
        src_vocab_size=vocab,
        d_model=width,
        n_heads=heads,
        d_ff=4 * width,
        n_encoder_layers=layers,
        n_decoder_layers=layers,
        dropout=0.0,
    )


FULL = Setup(model_size(256, 4, 3, 8000), (64, 256, 1024, 4096), window=64, steps_per_point=32)
SMOKE = Setup(model_size(32, 2, 1, 64), (8, 16, 32), window=4, steps_per_point=4)


def build(setup: Setup, kernel: str) -> Seq2SeqTransformer:
    """The model with `kernel` as decoder self-attention (sdpa elsewhere), in eval mode."""
    name, options = KERNELS[kernel]
    if name == "local":
        options = {"window": setup.window}
    attention = {"decoder_self": name, "decoder_self_options": options}
    cfg = TransformerConfig(
        **setup.model, max_positions=max(setup.lengths) + 1, attention=attention
    )
    torch.manual_seed(0)
    return Seq2SeqTransformer(cfg).eval()


@torch.inference_mode()
def step_times(model: Seq2SeqTransformer, steps: int, device: torch.device) -> list[float]:
    """Seconds of each of `steps` forced decode steps of one 16-token source sentence."""
    g = torch.Generator().manual_seed(1)
    vocab = model.config.src_vocab_size
    src = torch.randint(4, vocab, (1, 16), generator=g).to(device)  # (B=1, S)
    tokens = torch.randint(4, vocab, (steps,), generator=g).to(device)  # forced inputs
    memory, mask = model.encode(src)
    state = model.init_state(memory, mask, capacity=steps)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for t in range(steps):
        sync()
        start = time.perf_counter()
        model.decode_step(tokens[t : t + 1], state)
        sync()
        times.append(time.perf_counter() - start)
    return times


def table(setup: Setup, results: dict[str, list[float]]) -> str:
    """Markdown table: ms per step at each length, and last/first ratio."""
    head = " | ".join(f"t = {n}" for n in setup.lengths)
    lines = [
        f"| decoder self-attention | {head} | t = {setup.lengths[-1]} / t = {setup.lengths[0]} |",
        "|---" * (len(setup.lengths) + 2) + "|",
    ]
    for kernel, times in results.items():
        w = setup.steps_per_point
        means = [statistics.fmean(times[n - w : n]) * 1e3 for n in setup.lengths]
        cells = " | ".join(f"{m:.3f}" for m in means)
        label = f"local (window {setup.window})" if kernel == "local" else kernel
        lines.append(f"| {label} | {cells} | {means[-1] / means[0]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and print (and return) the table."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny model and lengths: seconds")
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = SMOKE if args.smoke else FULL
    device = torch.device(args.device)
    results = {}
    for kernel in args.kernels:
        model = build(setup, kernel).to(device)
        step_times(model, setup.steps_per_point, device)  # warm-up
        results[kernel] = step_times(model, max(setup.lengths), device)
    text = table(setup, results)
    print(
        f"Per-step decode time (ms), B=1, {device.type}, d_model={setup.model['d_model']}, "
        f"{setup.model['n_decoder_layers']} decoder layers, mean of {setup.steps_per_point} "
        "steps ending at t\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
