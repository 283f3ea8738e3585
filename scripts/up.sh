#!/usr/bin/env bash
# The main job (README): set up, then the whole system locally on a tiny model made on the spot.
# Extra arguments go to `shardline up` (e.g. --tp 2 --pp 2 --replicas 2 --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec shardline up "$@"
