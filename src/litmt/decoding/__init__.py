"""Decoding: DecodeConfig (config), greedy/beam search (search), decode() and sampling (api), ensembles, forced decoding (forced), alignments, attention maps and the Translator API (translator)."""
