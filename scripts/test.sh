#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then the whole CPU suite (GPU tests skip with a
# reason), then the Triton kernels' GPU tests once more, run by Triton's interpreter on CPU tensors.
# With arguments, only pytest with them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -rs "$@"
[ $# -eq 0 ] || exit 0
if python -c "import triton" 2>/dev/null; then
  echo "test.sh: the Triton kernels under TRITON_INTERPRET=1 (tests/kernels)"
  TRITON_INTERPRET=1 python -m pytest -q -W ignore::DeprecationWarning tests/kernels
else
  echo "test.sh: triton is not installed, so the interpreted kernel tests did not run"
fi
