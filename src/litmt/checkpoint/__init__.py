"""Checkpoints: atomic save and weights-only load (io), loading for inference (load), averaging (average), compatibility checks (compat), which files a job names (paths)."""
