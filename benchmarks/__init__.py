"""Benchmark and profiling scripts: run each from the repository root as ``python -m benchmarks.<name>``.

`benchmarks.common` holds what they share (the corpus, batches, timing); the library never
imports this folder.
"""
