#!/usr/bin/env bash
# GPU checks of scale-out training, for a machine with one or more CUDA GPUs (a few minutes):
#   1. the gpu-marked tests of tests/test_scaling.py: 16-mixed (fp16 autocast + GradScaler),
#      bf16-mixed, FSDP and DDP over every visible GPU (full checkpoint reloads), FP8 through
#      Transformer Engine when it is installed (skipped otherwise, saying so);
#   2. the CPU/gloo DDP and resume tests (slow-marked), which also hold on a GPU machine.
# Usage (from anywhere):  bash scripts/gpu_check_scaling.sh [OUT_DIR]
#   (default: $OUT or /tmp/litmt_gpu_check_scaling)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/litmt_gpu_check_scaling}}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

python - <<'PY' | tee "$out/gpu_env.txt"
import importlib.util, torch
assert torch.cuda.is_available(), "no CUDA device: run this on a GPU machine"
print("torch", torch.__version__, "| GPUs", torch.cuda.device_count(), "x",
      torch.cuda.get_device_name(), "sm%d%d" % torch.cuda.get_device_capability(),
      "| bf16", torch.cuda.is_bf16_supported())
for pkg in ("transformer_engine", "hydra_plugins.hydra_submitit_launcher"):
    print(f"{pkg:40s}", "installed" if importlib.util.find_spec(pkg.split(".")[0]) else "missing")
PY

status=0
python -m pytest tests/test_scaling.py -m gpu -q -rs -p no:cacheprovider \
    2>&1 | tee "$out/gpu_scaling_tests.log" || status=$?
python -m pytest tests/test_ddp.py tests/test_resume.py -m "slow or not slow" -q -rs \
    -p no:cacheprovider 2>&1 | tee "$out/ddp_resume_tests.log" || status=$?
exit "$status"
