"""Training: the LightningModule (module), losses, LR schedules, gradient clipping (grad), per-step seeds, callbacks/, fine-tuning and the end-of-run step (finalize)."""
