"""Refine an existing GEMM table in the captured decode step, then A/B it against the start.

    python -m benchmarks.step_tune --batch 64 --gemm-config benchmarks/results/gemm-h200-decode.json \
        --out gemm-h200-step.json [--linears qkv_proj,o_proj] [--attention]

The refinement is `shardline tune-gemm --in-step`'s (shardline/step_tuning.py), run here on a
table that already exists, on a built-in shape (Llama-3-8B by default; `--quant int8|fp8`: its
projections weight-only quantized), for one batch and the linears named; at `--batch 1` the
candidates are the GEMV's tiles (`--impls gemv`), which timed alone cannot show what PDL gains. Then,
with `--attention`, the decode attention's tiles and forced context splits are timed in the same
step (a question for the kernel's defaults, not a table entry), and last the start and end tables
are A/B'd by whole decode runs (decode_bench's ms/step, the bars' measure), twice, each first once.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from benchmarks import decode_bench
from shardline import step_tuning
from shardline.config import ModelConfig
from shardline.gemm_tuning import GemmTable
from shardline.model.random_weights import SHAPES

# The decode kernel's tiles, and context splits forced (by default one split at batch 64: 512
# programs already fill the GPU twice).
ATTENTION_VARIANTS = [{}, {"num_stages": 3}, {"BLOCK_N": 32}, {"BLOCK_N": 32, "num_stages": 3},
                      {"num_warps": 8}, {"splits": 1}, {"splits": 2}, {"splits": 2, "BLOCK_N": 32},
                      {"splits": 4, "BLOCK_N": 32}]


def attention_step_ms(engine, table: GemmTable, batch: int, variant: dict) -> float:
    from shardline.kernels import triton_attention  # Triton: imported on the GPU only
    default_override = triton_attention.DECODE_OVERRIDE
    triton_attention.DECODE_OVERRIDE = dict(default_override, **variant)
    try:
        return step_tuning.step_ms(engine, table, batch)
    finally:
        triton_attention.DECODE_OVERRIDE = default_override


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--quant", choices=["int8", "fp8"], help="weight-only quantization of the projections")
    ap.add_argument("--gemm-config", required=True, help="the table to start from (tune-gemm's)")
    ap.add_argument("--linears", default=",".join(step_tuning.LINEARS))
    ap.add_argument("--attention", action="store_true", help="then time ATTENTION_VARIANTS in the step")
    ap.add_argument("--attention-config", default="{}",
                    help='the decode attention tile the whole refinement runs under, e.g. \'{"num_stages": 1}\' '
                         "(keys over the kernel's choice for the batch, as decode_bench's --attention-configs)")
    ap.add_argument("--impls", help="only candidates of these implementations, comma-separated "
                    "(default, cublas, triton, ring, gemv), besides each linear's current choice")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--margin", type=float, default=0.003, help="relative gain in step time a change needs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    impls = set(args.impls.split(",")) if args.impls else None
    if impls and not impls <= step_tuning.IMPLS:
        ap.error(f"--impls {args.impls}: unknown {sorted(impls - step_tuning.IMPLS)}; "
                 f"choose from {','.join(sorted(step_tuning.IMPLS))}")
    linears = tuple(args.linears.split(","))
    if not set(linears) <= set(step_tuning.LINEARS):
        ap.error(f"--linears {args.linears}: unknown {sorted(set(linears) - set(step_tuning.LINEARS))}; "
                 f"choose from {','.join(step_tuning.LINEARS)}")
    if not 1 <= args.batch <= step_tuning.IN_STEP_MAX_M:
        ap.error(f"--batch {args.batch}: the step refines batches of 1 to {step_tuning.IN_STEP_MAX_M} rows "
                 "(above that the products are compute-bound and cuBLAS is the choice)")
    problem = step_tuning.settings_error(args.rounds, args.margin)
    if problem:
        ap.error(f"--rounds / --margin: {problem}")
    attention_config = decode_bench.parse_attention_config(ap, args.attention_config)
    if not torch.cuda.is_available():
        ap.error("step_tune times the captured decode step on a CUDA GPU; none is visible")
    start = GemmTable.load(args.gemm_config, torch.device("cuda"))
    if start is None:
        ap.error(f"{args.gemm_config}: missing or tuned on another GPU (run `shardline tune-gemm`)")
    cfg = ModelConfig(**SHAPES[args.shape])
    pipeline = decode_bench.build(args.shape, quantization=f"{args.quant}-weight-only" if args.quant else "none",
                                  max_num_seqs=max(args.batch, 16),
                                  max_model_len=min(4096, cfg.max_position_embeddings))  # GPT-J: 2,048
    engine = pipeline.engines[0]
    if attention_config:
        decode_bench.use_attention_config(attention_config)
    b = args.batch
    table = step_tuning.refine(engine, start, [b], cfg, torch.bfloat16, linears, rounds=args.rounds,
                               margin=args.margin, impls=impls)
    if args.attention:
        times: list[list[float]] = [[] for _ in ATTENTION_VARIANTS]
        for _ in range(args.rounds):
            for i, variant in enumerate(ATTENTION_VARIANTS):
                times[i].append(attention_step_ms(engine, table, b, variant))
        for variant, t in zip(ATTENTION_VARIANTS, times):
            print(json.dumps({"attention": variant, "batch": b, "step_ms": round(statistics.median(t), 4),
                              "rounds": [round(x, 4) for x in t]}), flush=True)
    table.save(args.out)
    print(f"wrote {args.out}", flush=True)
    gaps = engine.model.gemm_bucket_gaps(table)
    if gaps:
        print(f"warning: {gaps} lack batches the other projections have, and borrow a larger batch's entries "
              f"there; refine those batches for every linear (--linears {','.join(step_tuning.LINEARS)})", flush=True)
    # Each kind goes first in one of the two rounds: in call v8 two identical tables, start always
    # first, read 0.04-0.05 ms apart (docs/benchmarks.md, GEMM autotuning).
    pair = (("start", start), ("stepped", table))
    for r in range(2):
        for tag, t in pair if r == 0 else pair[::-1]:
            engine.model.configure_gemms(t)
            engine.graphs.reset()
            ms = decode_bench.decode_ms_per_step(pipeline, b)
            print(json.dumps({"table": tag, "batch": b, "decode_ms_per_step": round(ms, 3),
                              "tok_s": round(b * 1e3 / ms, 1)}), flush=True)


if __name__ == "__main__":
    main()
