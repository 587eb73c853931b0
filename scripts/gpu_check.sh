#!/usr/bin/env bash
# The GPU check of litmt: one script, one table, under a hard deadline (default 8 minutes).
#
# Targets a stock CUDA PyTorch image with lightning, sentencepiece and sacrebleu, and no
# hydra-core, omegaconf, datasets or wandb, no network, `python3` (not `python`): nothing is
# installed, no wheel folder is needed (scripts/gpu_check.py builds everything without Hydra).
#
# Before the run, on a machine that has ../shared/data/multi30k (once; 4.2 MB, git-ignored,
# travels with the repository as data/multi30k/):
#     bash scripts/gpu_check.sh --prepare-data [--from ../shared/data/multi30k]
# The check (on the GPU machine):
#     bash scripts/gpu_check.sh --out DIR [--deadline-s 480] [--tests-s 90] [--data data/multi30k]
# The same code path on the CPU with a toy corpus and a tiny model, in seconds (CI runs it):
#     bash scripts/gpu_check.sh --dry-run [--out DIR] [--inject-failure ROW] [--inject-crash ROW]
# (--inject-failure ROW: the row whose "check | setting" starts with ROW raises inside its
# guard and is a FAIL; --inject-crash ROW: gpu_check.py exits there as if it crashed. Both
# test that the table keeps every row; dry run only.)
#
# Steps, most valuable first (docs/guide/scale.md#gpu-check):
#   1. scripts/gpu_check.py, each row in its own guard (an error is that row's FAIL):
#      environment and kernel packages (installed, usable); sdpa/math/flex loss parity in
#      bf16 and fp16; bf16 matmul peak and Transformer-base tokens/s + MFU; flex vs sdpa
#      speed; the CPU recipe's model trained 2 minutes, beam-5 BLEU and sentences/s on
#      test2016; one-GPU FSDP (and FP8 where Transformer Engine is installed);
#   2. every gpu-marked test (pytest -m gpu) in the time left, at most --tests-s seconds;
#      the dry run only collects them;
#   3. the table: printed and written to OUT/gpu_check_table.md (rows: OUT/gpu_check_rows.jsonl,
#      each appended as soon as it is measured). gpu_check.py writes its plan first
#      (OUT/gpu_check_plan.jsonl); every planned row missing from the rows (a crash, a kill)
#      becomes a FAIL row saying why, so the table is never silently short.
# Exit: 0 when every row passed; 1 when a row failed (missing data, a parity miss, a run cut
# by its cap or the deadline, an error, a row not written, a failed test); 2 for a bad
# argument; 3 when python3 cannot import torch.
# Without a CUDA GPU (torch imports but sees none): one line, exit 0.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="use --out DIR, --data DIR, --deadline-s N, --tests-s N, --dry-run [--inject-failure ROW] [--inject-crash ROW], --prepare-data [--from DIR]"
data="data/multi30k"
from="../shared/data/multi30k"
out="${OUT:-/tmp/litmt_gpu_check}"
deadline_s=480
tests_s=90
dry_run=0
prepare=0
inject=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --data) data="$2"; shift 2 ;;
        --from) from="$2"; shift 2 ;;
        --deadline-s) deadline_s="$2"; shift 2 ;;
        --tests-s) tests_s="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --inject-failure|--inject-crash) inject+=("$1" "$2"); shift 2 ;;
        --prepare-data) prepare=1; shift ;;
        -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 ($usage)" >&2; exit 2 ;;
    esac
done
if [ ${#inject[@]} -gt 0 ] && [ $dry_run -eq 0 ]; then
    echo "gpu_check: ${inject[0]} is for the dry run only (add --dry-run)" >&2
    exit 2
fi

if [ $prepare -eq 1 ]; then
    mkdir -p "$data" || exit 1
    for f in train.en train.de valid.en valid.de test2016.en test2016.de; do
        if ! cp "$from/$f" "$data/$f"; then
            echo "gpu_check: cannot copy $from/$f; pass --from DIR (Multi30k's text files)" >&2
            exit 1
        fi
    done
    echo "gpu_check: $data filled from $from ($(du -sh "$data" | cut -f1)); it is git-ignored and travels with the repository"
    exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
    echo "gpu_check: python3 is not on the PATH" >&2
    exit 3
fi
if ! err=$(python3 -c "import torch" 2>&1); then
    echo "gpu_check: python3 cannot import torch: $(printf '%s\n' "$err" | tail -1)" >&2
    exit 3
fi
if [ $dry_run -eq 0 ] && ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU on this machine; nothing to check (run it where torch.cuda.is_available())"
    exit 0
fi

start=$SECONDS
mkdir -p "$out"
rows="$out/gpu_check_rows.jsonl"
: > "$rows"
rm -f "$out/gpu_check_current.txt" "$out/gpu_check_plan.jsonl"
export PYTHONPATH="$PWD/src:$PWD/tests/helpers${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
row() {  # check, setting, result, status
    python3 - "$rows" "$@" <<'PY'
import json, sys
path, check, setting, result, status = sys.argv[1:6]
with open(path, "a") as f:
    f.write(json.dumps({"check": check, "setting": setting, "result": result, "status": status, "peak_mem": "-"}) + "\n")
print(f"[gpu_check] {check} | {setting} | {result} | {status}", flush=True)
PY
}
left() { echo $((deadline_s - (SECONDS - start))); }
complete_rows() {  # exit status of gpu_check.py, why rows may be missing
    python3 - "$out" "$@" <<'PY'
import json, sys
from pathlib import Path
out, rc, why = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def load(name):
    path = out / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
plan, rows = load("gpu_check_plan.jsonl"), load("gpu_check_rows.jsonl")
written = [(r["check"], r["setting"]) for r in rows]
missing = []
for p in plan:  # every planned row, in order; a row written twice counts once per plan entry
    key = (p["check"], p["setting"])
    if key in written:
        written.remove(key)
    else:
        missing.append(key)
new = [(check, setting, f"not written: {why}") for check, setting in missing]
failed = any(r["status"] == "FAIL" for r in rows)
if not plan:
    new.append(("measurements", "scripts/gpu_check.py", f"no plan written: {why}"))
elif not missing and (rc not in (0, 1) or (rc == 1 and not failed)):
    new.append(("measurements", "scripts/gpu_check.py", why))
with (out / "gpu_check_rows.jsonl").open("a") as f:
    for check, setting, result in new:
        f.write(json.dumps({"check": check, "setting": setting, "result": result, "status": "FAIL", "peak_mem": "-"}) + "\n")
        print(f"[gpu_check] {check} | {setting} | {result} | FAIL", flush=True)
PY
}

# 1. the measurements, leaving --tests-s (or in the dry run 30 s) for the tests and the table
if [ $dry_run -eq 1 ]; then reserve=30; mode=(--dry-run); else reserve=$((tests_s + 10)); mode=(); fi
budget=$(( $(left) - reserve ))
if [ $budget -lt 30 ]; then
    row "measurements" "scripts/gpu_check.py" "not run: --deadline-s $deadline_s leaves ${budget}s after the tests" "FAIL"
else
    timeout -k 10 "$budget" python3 scripts/gpu_check.py "${mode[@]}" "${inject[@]}" --data "$data" \
        --out "$out" --deadline-s "$((budget - 10))" > "$out/gpu_check_runs.log" 2>&1
    rc=$?
    at=$(cat "$out/gpu_check_current.txt" 2>/dev/null || echo "no row (between rows)")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="gpu_check.py was killed at its ${budget}s limit during: $at"
    else
        last=$(tail -1 "$out/gpu_check_runs.log" | cut -c1-150)
        why="gpu_check.py stopped (exit $rc) during: $at; its last line: $last (gpu_check_runs.log)"
    fi
    complete_rows "$rc" "$why"
fi

# 2. every gpu-marked test, in the files that hold them (the others may import Hydra)
gpu_files=$(grep -rl --include='test_*.py' -e "mark.gpu" tests | sort)
pytest_args=(-m gpu -q -rs -p no:cacheprovider --basetemp "$out/pytest")
if [ $dry_run -eq 1 ]; then pytest_args+=(--collect-only); fi
tests_left=$(( $(left) - 10 ))
[ $tests_left -gt "$tests_s" ] && tests_left=$tests_s
if [ $tests_left -lt 20 ]; then
    row "gpu-marked tests" "pytest -m gpu" "not run: ${tests_left}s left before the deadline" "FAIL"
else
    # shellcheck disable=SC2086
    timeout -k 5 "$tests_left" python3 -m pytest $gpu_files "${pytest_args[@]}" > "$out/gpu_tests.log" 2>&1
    rc=$?
    summary=$(grep -E "(passed|failed|skipped|error|collected|deselected)" "$out/gpu_tests.log" | tail -1)
    setting="pytest -m gpu$([ $dry_run -eq 1 ] && echo ' --collect-only')"
    case $rc in
        0) row "gpu-marked tests" "$setting" "${summary:-no summary}" "ok" ;;
        5) row "gpu-marked tests" "$setting" "no tests collected" "FAIL" ;;
        124|137) row "gpu-marked tests" "$setting" "cut at ${tests_left}s (gpu_tests.log)" "FAIL" ;;
        *) row "gpu-marked tests" "$setting" "${summary:-exit $rc} (gpu_tests.log)" "FAIL" ;;
    esac
fi

# 3. one table
python3 - "$rows" "$out/gpu_check_table.md" "$((SECONDS - start))" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
lines = ["| check | setting | result | status | peak mem |", "|---|---|---|---|---|"]
cell = lambda r, k: str(r.get(k, "-")).replace("|", "\\|")
lines += ["| " + " | ".join(cell(r, k) for k in ("check", "setting", "result", "status", "peak_mem")) + " |" for r in rows]
failed = [r for r in rows if r["status"] == "FAIL"]
lines.append(f"\n{len(rows)} rows, {len(failed)} failed, {sys.argv[3]} s in all")
lines += [f"failed: {r['check']} | {r['setting']}" for r in failed]
table = "\n".join(lines)
open(sys.argv[2], "w").write(table + "\n")
print(table)
sys.exit(1 if failed else 0)
PY
