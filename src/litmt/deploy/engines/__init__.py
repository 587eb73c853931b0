"""Decoding engines other than torch: CTranslate2 (ct2, with its prefix rules in ct2_prefix) and onnxruntime (onnx); where converted models are cached (cache)."""
