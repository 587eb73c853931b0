"""Batches: the token-budget sampler (sampler) and its epoch plan (plan, scratch), the padded collate (collate), the resumable DataLoader (loader)."""
