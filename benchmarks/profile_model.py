"""Profile one model of the benchmark with torch.profiler: where does the time go?

    python -m benchmarks.profile_model --model litmt --size small --what train
    python -m benchmarks.profile_model --model marian --size base --what beam --rows 30

Uses the same models, batches and decode loops as `benchmarks/benchmark.py` and prints the
operators sorted by self CPU time (plus the share of the step spent in each).
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import peers
from benchmarks.common import REPO, decode_sources, load_tokenizer, training_batches


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="litmt", choices=list(peers.BUILDERS))
    p.add_argument("--size", default="small", choices=list(peers.SIZES))
    p.add_argument("--what", default="train", choices=["train", "greedy", "beam"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--decode-batch", type=int, default=32)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="torch.compile the litmt model")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--trace", default="", help="write a chrome trace here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    tok = load_tokenizer(8000, None, REPO / "data" / "benchmark")
    size, vocab = peers.SIZES[args.size], tok.src_vocab_size
    torch.manual_seed(0)
    model = peers.BUILDERS[args.model](size, vocab, 0.1)
    if args.what == "train":
        batch = training_batches(tok, args.max_tokens, 1)[0]
        step = peers.make_train_step(args.model, model.train(), compile_model=args.compile)
        run = lambda: step(batch)  # noqa: E731
    else:
        src = decode_sources(tok, args.decode_batch)
        beam = 1 if args.what == "greedy" else 5
        fn = peers.decode_fn(args.model, model.eval(), beam, args.decode_steps)
        run = lambda: fn(src)  # noqa: E731
    run()  # warm-up (optimiser state, compilation)
    run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        run()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    print(table)
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()
