"""Scripts that write tables and plots for the docs from measured runs: run each from the repository root as ``python -m reports.<name>``."""
