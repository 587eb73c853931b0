"""What a trained model says about given text: word alignments (alignment), attention maps (attention_maps) and forced scoring of given translations (forced)."""
