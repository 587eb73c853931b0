#!/usr/bin/env bash
# GPU checks of the attention backends, for a machine with a CUDA GPU (a few minutes):
#   1. the gpu-marked tests (flash / xformers / te / flex / auto / sdpa against math in
#      fp16 and bf16, padding, causal, cross, decode steps, gradients; each backend whose
#      package is missing is skipped and says which extra to install),
#   2. a short bf16 benchmark of every available backend at L = 1024, 4096, 16384.
# Usage (from anywhere):  bash scripts/gpu_check.sh [OUT_DIR]     (default: $OUT or /tmp/litmt_gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/litmt_gpu_check}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

python - <<'PY' | tee "$out/gpu_env.txt"
import importlib.util, torch
assert torch.cuda.is_available(), "no CUDA device: run this on a GPU machine"
print("torch", torch.__version__, "| GPU", torch.cuda.get_device_name(),
      "sm%d%d" % torch.cuda.get_device_capability())
for pkg in ("flash_attn", "xformers", "transformer_engine", "triton"):
    print(f"{pkg:20s}", "installed" if importlib.util.find_spec(pkg) else "missing")
PY

status=0
python -m pytest tests/attention/test_gpu_backends.py -m gpu -q -rs -p no:cacheprovider \
    2>&1 | tee "$out/gpu_tests.log" || status=$?

python scripts/benchmark_attention.py --device cuda --dtype bf16 --lengths 1024 4096 16384 \
    --max-seconds 10 --sweep-timeout 150 --out "$out" 2>&1 | tee "$out/gpu_benchmark.log" \
    || status=$?
exit "$status"
