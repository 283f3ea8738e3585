#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then the whole CPU suite. GPU tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q -rs "$@"
