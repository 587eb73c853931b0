"""Decoding: DecodeConfig (config), greedy/beam search (search), decode() and sampling (api), ensembles, forced scoring (forced), alignments, attention maps and the Translator API (translator)."""
