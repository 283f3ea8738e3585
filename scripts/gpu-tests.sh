#!/usr/bin/env bash
# The GPU tests, on a CUDA machine whose Python already has torch with CUDA (no set-up here: GPU
# machines are often offline). First the kernel and GEMM-tuning tests, spread over worker
# processes that share the GPU (pytest-xdist): each test is small, and most of its time is Triton
# compiling on the CPU. Then the engine and end-to-end tests, spread too but over fewer processes
# (GPU_ENGINE_WORKERS, 6): each builds tiny models and a KV cache of a fixed number of blocks (no
# test sizes its cache from free memory), and many run a reference path in a process of its own.
# In one process they outran a 10-minute device call on an H200 (sessions h and j).
#   bash scripts/gpu-tests.sh            # all of them
#   GPU_TEST_WORKERS=4 GPU_ENGINE_WORKERS=2 bash scripts/gpu-tests.sh
# With arguments, only `pytest -m gpu` with them (one process); `--print-runs` prints the two runs'
# paths, one run a line, and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# What the first run spreads over processes.
SPREAD_TESTS=(tests/kernels tests/test_linear_epilogues.py tests/test_gemm_tuning.py tests/test_step_tuning.py)
# The second run: every other test file that holds a GPU test (by its mark). Only those are
# collected, since a GPU machine lacks what some CPU-only modules import (the chart tests' Helm).
spread_re="^($(IFS='|'; echo "${SPREAD_TESTS[*]}"))"
mapfile -t REST_TESTS < <(grep -rlE 'mark\.gpu' tests --include='test_*.py' | grep -vE "$spread_re" | sort)
if [ "${1:-}" = "--print-runs" ]; then
  echo "${SPREAD_TESTS[*]}"
  echo "${REST_TESTS[*]}"
  exit 0
fi
if ! "$PY" -c "import shardline.kernels, shardline.stage_worker" 2>/dev/null; then
  echo "gpu-tests.sh: $PY cannot import shardline's packages (shardline.stage_worker lives in" \
       "services/stage-worker/); install it first: $PY -m pip install --no-build-isolation --no-deps -e ." >&2
  exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-tests.sh: $PY sees no CUDA device; the GPU tests need one (on CPU, run scripts/test.sh)" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider "$@"
fi
cores=$(nproc)
workers=${GPU_TEST_WORKERS:-$(( cores < 8 ? cores : 8 ))}
engine_workers=${GPU_ENGINE_WORKERS:-$(( workers < 6 ? workers : 6 ))}
spread=() spread_rest=()
if "$PY" -c "import xdist" 2>/dev/null; then
  spread=(-n "$workers") spread_rest=(-n "$engine_workers")
else
  echo "gpu-tests.sh: pytest-xdist is not installed, so each run is one process (the kernel tests ~11" \
       "minutes on an H200, the engine tests longer than one 10-minute device call)"
fi
rc=0  # the second run goes ahead when the first fails, so that one call reports both
"$PY" -m pytest -q -rs -m gpu -p no:cacheprovider "${spread[@]}" "${SPREAD_TESTS[@]}" || rc=$?
"$PY" -m pytest -q -rs -m gpu -p no:cacheprovider --durations 12 "${spread_rest[@]}" "${REST_TESTS[@]}" || rc=$?
exit $rc
