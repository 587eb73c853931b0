"""Lightning callbacks, one per file: validation/test BLEU (translation_scorer), SIGTERM checkpoints (preemption), the W&B heatmap (attention_heatmap)."""
