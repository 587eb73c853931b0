"""Speed harnesses: run each from the repository root as ``python -m benchmarks.<name>``.

`benchmarks.common` holds what they share (the corpus, batches, timing) and `benchmarks.peers`
the models litmt is timed against. Parity and determinism checks live in ``checks/``, the
scripts that write the docs' tables in ``reports/``; the library never imports any of them.
"""
