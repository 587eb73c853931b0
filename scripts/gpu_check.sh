#!/usr/bin/env bash
# The GPU check of litmt: one script, at most 8 minutes on one H100/H200-class GPU.
#   0. without CUDA: says so in one line and exits 0;
#   1. installs missing pure-Python dependencies (hydra-core, omegaconf, antlr4) from a wheel
#      folder (--wheels DIR; how to make it: docs/scaling.md, "GPU check"); `datasets` and
#      `wandb` are not needed: the training runs below read the text files directly;
#   2. lists the optional kernel packages (flash-attn, xformers, transformer-engine): a
#      missing one is skipped, with a message, by every step below;
#   3. runs every gpu-marked test (tests that need `datasets` skip without it);
#   4. scripts/gpu_check.py: 200 steps on Multi30k with each exact backend present, in
#      bf16-mixed and 16-mixed, final loss within 2 % of sdpa's (same seed, same batches);
#      decoding of test2016 with the bf16-trained checkpoint; Transformer-base training
#      throughput (target tokens/s, MFU); an FP8 run where Transformer Engine is installed
#      (reload + translate); a one-GPU FSDP run;
#   5. prints one table and writes it to OUT/gpu_check_table.md.
# Usage:  bash scripts/gpu_check.sh [--wheels DIR] [--data DIR] [--out DIR]
#   defaults: --wheels $LITMT_WHEELS or wheels/, --data ../shared/data/multi30k,
#   --out $OUT or /tmp/litmt_gpu_check
set -uo pipefail
cd "$(dirname "$0")/.."
wheels="${LITMT_WHEELS:-wheels}"
data="../shared/data/multi30k"
out="${OUT:-/tmp/litmt_gpu_check}"
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) wheels="$2"; shift 2 ;;
        --data) data="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "gpu_check: unknown argument $1 (use --wheels DIR, --data DIR, --out DIR)" >&2; exit 2 ;;
    esac
done

if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU on this machine; nothing to check (run it where torch.cuda.is_available())"
    exit 0
fi

total_s=470          # the whole script's budget (8 minutes, less a margin for the table)
tests_timeout_s=150  # the gpu-marked tests
start=$SECONDS
mkdir -p "$out"
rows="$out/gpu_check_rows.jsonl"
: > "$rows"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
row() {  # check, setting, result, status
    python - "$rows" "$@" <<'PY'
import json, sys
path, check, setting, result, status = sys.argv[1:6]
with open(path, "a") as f:
    f.write(json.dumps({"check": check, "setting": setting, "result": result, "status": status}) + "\n")
print(f"[gpu_check] {check} | {setting} | {result} | {status}", flush=True)
PY
}

# 1. pure-Python dependencies the image lacks, from the wheel folder (no network)
missing=$(python - <<'PY'
import importlib.util
pkgs = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime"}
print(" ".join(p for m, p in pkgs.items() if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    if [ -d "$wheels" ] && python -m pip install -q --no-index --find-links "$wheels" $missing; then
        row "dependencies" "$missing" "installed from $wheels" "ok"
    else
        row "dependencies" "$missing" "missing; no usable wheel folder at $wheels (docs/scaling.md)" "FAIL"
    fi
fi

# 2. environment and optional kernel packages
env_line=$(python - <<'PY'
import torch
cap = "sm%d%d" % torch.cuda.get_device_capability()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()} {cap}, "
      f"bf16 {torch.cuda.is_bf16_supported()}")
PY
)
row "environment" "-" "$env_line" "ok"
for pkg in flash_attn xformers transformer_engine; do
    version=$(python -c "import importlib.metadata as m, importlib.util as u, sys
name = {'flash_attn': 'flash-attn', 'transformer_engine': 'transformer-engine'}.get('$pkg', '$pkg')
if u.find_spec('$pkg') is None: sys.exit(1)
try: print(m.version(name))
except m.PackageNotFoundError: print('installed')" 2>/dev/null)
    if [ -n "$version" ]; then
        row "kernel package" "$pkg" "$version" "ok"
    else
        row "kernel package" "$pkg" "not installed: its tests and runs are skipped" "skipped"
    fi
done

# 3. every gpu-marked test
# only the files that hold gpu tests: others may import packages this image lacks (datasets)
gpu_files=$(grep -rl --include='test_*.py' -e "mark.gpu" tests | sort)
timeout "$tests_timeout_s" python -m pytest $gpu_files -m gpu -q -rs -p no:cacheprovider \
    > "$out/gpu_tests.log" 2>&1
rc=$?
summary=$(grep -E "(passed|failed|skipped|error)" "$out/gpu_tests.log" | tail -1)
case $rc in
    0) row "gpu-marked tests" "pytest -m gpu" "${summary:-no summary}" "ok" ;;
    5) row "gpu-marked tests" "pytest -m gpu" "no tests collected" "FAIL" ;;
    124) row "gpu-marked tests" "pytest -m gpu" "timed out after ${tests_timeout_s}s" "FAIL" ;;
    *) row "gpu-marked tests" "pytest -m gpu" "${summary:-exit $rc} (see $out/gpu_tests.log)" "FAIL" ;;
esac

# 4. training, decoding, throughput, FP8, FSDP
left=$((total_s - (SECONDS - start)))
python scripts/gpu_check.py --data "$data" --out "$out" --budget-s "$left" \
    > "$out/gpu_check_runs.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    row "training runs" "scripts/gpu_check.py" "exit $rc: $(tail -1 "$out/gpu_check_runs.log")" "FAIL"
fi

# 5. one table
python - "$rows" "$out/gpu_check_table.md" "$((SECONDS - start))" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
lines = ["| check | setting | result | status |", "|---|---|---|---|"]
lines += [f"| {r['check']} | {r['setting']} | {r['result']} | {r['status']} |" for r in rows]
failed = sum(r["status"] == "FAIL" for r in rows)
lines.append(f"\n{len(rows)} rows, {failed} failed, {sys.argv[3]} s in all")
table = "\n".join(lines)
open(sys.argv[2], "w").write(table + "\n")
print(table)
sys.exit(1 if failed else 0)
PY
