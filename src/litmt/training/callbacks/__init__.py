"""Lightning callbacks, one per file: validation/test BLEU (validation_bleu), SIGTERM checkpoints (preemption), the W&B heatmap (attention_heatmap)."""
