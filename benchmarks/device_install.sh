# Sourced, not run: on an offline GPU machine, the wheels of .whl/ (scripts/device_wheels.sh; carry
# [".whl"] in the device call) go to /tmp/site, PYTHONPATH takes them for this shell and what it
# starts, and shardline is installed editable (its log in $OUT/pip.log, else /tmp/pip.log).
# benchmarks/exp12_ab.sh and benchmarks/issue4_h200.sh source it.
# What fails is said on stderr and the caller goes on: the machine's own torch and Triton may serve.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
else
  echo "device_install.sh: no wheels in .whl/; run scripts/device_wheels.sh here and carry [\".whl\"]" >&2
fi
python3 -m pip install -q --no-build-isolation --no-deps -e . > "${OUT:-/tmp}/pip.log" 2>&1 \
  || echo "device_install.sh: installing shardline (pip install -e .) failed; see ${OUT:-/tmp}/pip.log" >&2
