#!/usr/bin/env bash
# What issue 4 still needs from one H200, in one device call (carry [".whl"], made by
# scripts/device_wheels.sh); logs and tables go to $OUT (/tmp/issue4_h200). Each part runs under a
# cap of its own (540 s together, leaving the install room in a 600 s call), the open question
# first, so that a part that runs long cuts only what follows:
#   1. the H200 table against the 12-bit form for gate/up (up) and gate/up and down (ud4), steps
#      back to back at batch 64: each one's step, SM clock, power and energy, two alternated rounds.
#      Does the 700 W cap's clock drop take the form's gain on the H200? (benchmarks/exp12_ab.sh
#      with TESTS=0 TABLES="base up ud4" POWER=1 AB=0; cap POWER_S, 160 s)
#   2. the same tables' batch-64 decode loop, two alternated rounds (AB=1 POWER=0; cap AB_S, 230 s);
#      its base rows are the bar's number
#   3. the served path against the engine at batch 16 and 64 on the H200 table (benchmarks/e2e_bench;
#      cap E2E_S, 150 s; E2E=0 skips it too)
# A cap is whole seconds; 0 skips its part (timeout's own 0 would mean no cap at all).
# On any other GPU it stops with status 3 before installing anything: an H100 has all three (the
# power A/B in calls r7 and w3, served on the tuned table in t2-t4). GPU_NAME names the GPU instead
# of nvidia-smi (tests/test_issue4_h200_script.py runs the refusals on CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/issue4_h200}; mkdir -p "$OUT"
for cap in POWER_S AB_S E2E_S; do
  if [[ -n "${!cap:-}" && ! "${!cap}" =~ ^[0-9]+$ ]]; then
    echo "issue4_h200.sh: $cap='${!cap}' is no whole number of seconds; give a cap such as 160, or 0" \
         "to skip that part" >&2; exit 2
  fi
  [[ -n "${!cap:-}" ]] && printf -v "$cap" '%d' "$((10#${!cap}))"  # "00" is 0, "08" is 8
done
table=benchmarks/results/gemm-h200-decode.json
gpu=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
if [[ -z "$gpu" ]]; then
  echo "issue4_h200.sh: no GPU found (nvidia-smi gave no name); run it on an H200, or set GPU_NAME" >&2; exit 3
fi
if [[ "$gpu" != *H200* ]]; then
  echo "issue4_h200.sh: this GPU is '$gpu', not an H200; issue 4's open numbers are the H200's" \
       "(an H100 has them: docs/benchmarks.md, the 12-bit weight form). Give the machine back." >&2; exit 3
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
source benchmarks/device_install.sh
git log --oneline | head -1 | tee "$OUT/commit.txt"; date -u | tee -a "$OUT/commit.txt"
ab() {  # ab NAME CAP ENV...: exp12_ab.sh's tables with ENV, under CAP seconds, its log to $OUT/NAME.txt
  local name=$1 cap=$2; shift 2
  if [[ "$cap" == 0 ]]; then echo "$name skipped (its cap is 0)"; return; fi
  env OUT="$OUT" INSTALL=0 TESTS=0 TABLES="base up ud4" ROUNDS=2 BASE=$table "$@" \
    timeout "$cap" bash benchmarks/exp12_ab.sh > "$OUT/$name.txt" 2>&1
  echo "$name rc=$?"; tail -12 "$OUT/$name.txt"
}
ab exp12_power "${POWER_S:-160}" AB=0 POWER=1
ab exp12_decode "${AB_S:-230}" AB=1 POWER=0
if [[ "${E2E:-1}" == 1 && "${E2E_S:-150}" != 0 ]]; then
  timeout "${E2E_S:-150}" python3 -m benchmarks.e2e_bench --shape llama3-8b --device cuda --batch 16,64 \
    --gateways 1 --gemm-config $table > "$OUT/e2e.txt" 2>&1
  echo "e2e rc=$?"; tail -20 "$OUT/e2e.txt"
fi
