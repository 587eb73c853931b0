"""Runtime: precision plans and FP8 (precision), and the Lightning internals litmt relies on (lightning_compat)."""
