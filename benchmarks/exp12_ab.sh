#!/usr/bin/env bash
# The exp12 GPU tests and a batch-64 A/B on one GPU: the H200 table (relabelled to this GPU if another),
# + gate/up in exp12, and on top of that o (SPLIT_K 4 or 2), qkv (SPLIT_K 2), down (SPLIT_K 4: a 128-row tile of
# random N(0, 0.02) weights lists ~160 corrections, ~40 a split), o and down, all four.
# TABLES="base up ud4" A/Bs a subset; TESTS=0 skips the tests; ROUNDS rounds (2); POWER=1 then A/Bs the same tables'
# clock, power and energy a step under load (benchmarks/step_power.py --gemm-configs); AB=0 skips the decode A/B.
# BATCHES="16 32" puts the variants' entries at those batches and A/Bs there (64); BASE=table starts from another table
# (e.g. benchmarks/results/gemm-h100-decode.json). Device call: carry [".whl"] (scripts/device_wheels.sh).
# The tables are written to WORK (/tmp/exp12_ab) and copied to OUT; INSTALL=0 skips the wheels and the install, and
# GPU_NAME names the GPU instead of nvidia-smi (both for tests/test_exp12_ab_script.py, which runs the tables' part on CPU).
# Bad input is refused before anything is installed, tested or written.
T=${BASE:-benchmarks/results/gemm-h200-decode.json}
B0=$T; [[ -f "$T" ]] || { echo "exp12_ab.sh: BASE=$T is no file; give a GEMM table (benchmarks/results/gemm-*-decode.json)" >&2; exit 2; }
ALL="base up uo4 uo2 uq2 uo4q2 ud4 uod4 all"; TABLES=${TABLES:-$ALL}  # TABLES: a subset
for t in $TABLES; do [[ " $ALL " == *" $t "* ]] || { echo "exp12_ab.sh: TABLES names '$t', which is no table; name some of: $ALL" >&2; exit 2; }; done
if [[ "${INSTALL:-1}" == 1 ]]; then source benchmarks/device_install.sh; fi
W=${WORK:-/tmp/exp12_ab}; mkdir -p $W
gpu=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)}; echo "GPU: $gpu"; git log --oneline | head -1
if [[ "${TESTS:-1}" == 1 ]]; then timeout 150 python -m pytest -q tests/kernels/test_exp12.py "tests/stage_worker/test_gpu_engine.py::test_tuned_exp12_products_keep_bf16_greedy_choices" > ${OUT:-/tmp}/tests.txt 2>&1; tail -4 ${OUT:-/tmp}/tests.txt; fi
BATCHES=${BATCHES:-64}
E='{"impl": "exp12", "config": {"BLOCK_K": 128, "STAGES": 4'
tv() { python -m benchmarks.table_variant "$@" 2>&1 | tail -1; }
# tv_at FROM LINEAR SPLIT OUT: FROM with LINEAR in exp12 (K split SPLIT) at each of BATCHES
tv_at() { local a=() b; for b in $BATCHES; do a+=(--set "$2@$b=$E${3:+, \"SPLIT_K\": $3}}}"); done; tv --gemm-config $1 "${a[@]}" --out $4; }
tg=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gpu'])" $T)
if [[ "$gpu" != "$tg" ]]; then tv --gemm-config $T --gpu "$gpu" --out $W/base.json; T=$W/base.json; fi
tv_at $T up_proj "" $W/up.json
tv_at $W/up.json o_proj 4 $W/uo4.json
tv_at $W/up.json o_proj 2 $W/uo2.json
tv_at $W/up.json qkv_proj 2 $W/uq2.json
tv_at $W/uo4.json qkv_proj 2 $W/uo4q2.json
tv_at $W/up.json down_proj 4 $W/ud4.json
tv_at $W/uo4.json down_proj 4 $W/uod4.json
tv_at $W/uod4.json qkv_proj 2 $W/all.json
cp $T $W/base.json 2>/dev/null
same() { python3 -c "
import json, sys
def bare(x): return {k: bare(v) for k, v in x.items() if k != 'note'} if isinstance(x, dict) else x  # notes aside
sys.exit(bare(json.load(open(sys.argv[1]))) != bare(json.load(open(sys.argv[2]))))" $1 $2; }
for t in $TABLES; do [[ $t != base ]] && same $W/base.json $W/$t.json && \
  echo "exp12_ab.sh: $t is BASE itself ($B0 has those entries in exp12 already): an A/A, not an A/B" >&2; done
V=$(for t in $TABLES; do printf $W/%s.json, $t; done); V=${V%,}
cp ${V//,/ } ${OUT:-/tmp}/ 2>/dev/null
if [[ "${AB:-1}" == 1 ]]; then
  timeout 400 python benchmarks/decode_bench.py --batches ${BATCHES// /,} --skip int8,fp8,gptj,prefill --gemm-configs $V \
    --ab-rounds ${ROUNDS:-2} > ${OUT:-/tmp}/ab.txt 2> ${OUT:-/tmp}/ab.err
  grep decode_ms ${OUT:-/tmp}/ab.txt | grep -v '"gpu"' | python3 -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); g=d.get('gpu_state') or {}
    print(d['batch'], d['decode_ms_per_step'], d['graph_replay_ms'], g.get('sm_mhz'), 'MHz', g.get('power_w'), 'W', d['gemm_config'])"
  grep -v '^{' ${OUT:-/tmp}/ab.txt | tail -3; tail -3 ${OUT:-/tmp}/ab.err
fi
if [[ "${POWER:-0}" == 1 ]]; then
  timeout 240 python -m benchmarks.step_power --batch ${BATCHES%% *} --gemm-configs $V --rounds 2 --seconds 3 \
    > ${OUT:-/tmp}/power.txt 2> ${OUT:-/tmp}/power.err; tail -6 ${OUT:-/tmp}/power.txt; tail -3 ${OUT:-/tmp}/power.err
fi
