"""Choose each linear's GEMM by the captured decode step, not by the product timed alone.

    python -m benchmarks.step_tune --batch 64 --gemm-config benchmarks/results/gemm-h200-decode.json \
        --out gemm-h200-step.json

`shardline tune-gemm` times each product alone, back to back with itself. In the step a product
follows a norm or the attention and, with programmatic dependent launch, overlaps their tails, so
the order alone can differ from the order in the step (docs/benchmarks.md: the batch-1 entries,
the ring GEMM's table at batch 64). This script builds the Llama-3-8B-shape engine on random
weights, starts from a table, and for one linear at a time replays the captured decode step
(context 192, `decode_bench.graph_replay_ms`) with each candidate in that linear's entry: the
table's choice, cuBLAS, and the ring GEMM's tiles (Hopper). Candidates are timed in alternating
rounds and ranked by their median; a linear's entry changes only when a candidate beats the
current one by more than `--margin` (the spread between rounds). Writes the table it ends with and
prints one line a candidate, then the start and end tables A/B'd by whole decode runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch

from benchmarks import decode_bench
from shardline.config import ModelConfig
from shardline.kernels import triton_attention
from shardline.gemm_tuning import RING_CONFIGS, GemmTable, key, linear_shapes, triton_candidates
from shardline.model.random_weights import SHAPES

# Besides RING_CONFIGS (tune-gemm's): tiles whose ring fits twice in a multiprocessor's shared
# memory (96 KB), so that every program of a 224-program product is resident at once; deeper rings
# of the 64-row tile that won qkv and o in the step (2026-11-30, first pass); fewer early stages.
RING_MORE = [dict(BLOCK_N=bn, BLOCK_K=bk, STAGES=st, SPLIT_K=sk) for bn, bk, st, sk in (
    (128, 64, 4, 1), (128, 128, 2, 1), (64, 128, 3, 1), (64, 128, 3, 2), (128, 64, 4, 2),
    (64, 128, 5, 1), (64, 128, 6, 1), (64, 64, 8, 1), (32, 128, 4, 1), (32, 128, 6, 1), (32, 128, 6, 2))]
RING_MORE += [dict(BLOCK_N=64, BLOCK_K=128, STAGES=4, SPLIT_K=1, EARLY=e) for e in (0, 1, 2)]
# Attention variants timed after the linears: the decode kernel's tiles, and context splits forced
# (by default one split at batch 64: 512 programs already fill the GPU twice).
ATTENTION_VARIANTS = [{}, {"num_stages": 3}, {"BLOCK_N": 32}, {"BLOCK_N": 32, "num_stages": 3},
                      {"num_warps": 8}, {"splits": 2}, {"splits": 2, "BLOCK_N": 32}, {"splits": 4, "BLOCK_N": 32}]


DEFAULT_ATTENTION, DEFAULT_SPLITS = dict(triton_attention.DECODE_CONFIG), triton_attention._num_splits


def candidates(current: dict, m: int) -> list[dict]:
    """The current choice first, then cuBLAS, the ring tiles and the split-K kernel's TMA tiles,
    each once."""
    out = [current]
    out.append({"impl": "cublas", "config": None})
    out += [{"impl": "ring", "config": c} for c in RING_CONFIGS + RING_MORE]
    out += [{"impl": "triton", "config": dict(c, TMA=1)} for c in triton_candidates(m)]
    seen, unique = set(), []
    for c in out:
        tag = json.dumps({"impl": c["impl"], "config": c.get("config")}, sort_keys=True)
        if tag not in seen:
            seen.add(tag)
            unique.append(c)
    return unique


def label(c: dict) -> str:
    cfg = c.get("config") or {}
    return c["impl"] + ("" if not cfg else " " + ",".join(f"{k}={v}" for k, v in cfg.items()))


def step_ms(pipeline, table: GemmTable, batch: int, reps: int, attention: dict | None = None) -> float:
    engine = pipeline.engines[0]
    engine.model.configure_gemms(table)
    attention = dict(attention or {})
    splits = attention.pop("splits", None)
    triton_attention.DECODE_CONFIG = dict(DEFAULT_ATTENTION, **attention)
    triton_attention._num_splits = (lambda *a, **k: splits) if splits else DEFAULT_SPLITS
    engine.graphs.reset()
    decode_bench.loaded_graph(pipeline, batch, capture=True)
    return min(decode_bench.graph_replay_ms(pipeline, batch) for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gemm-config", required=True, help="the table to start from (tune-gemm's)")
    ap.add_argument("--linears", default="up_proj,down_proj,qkv_proj,o_proj,lm_head")
    ap.add_argument("--attention", action="store_true", help="then time ATTENTION_VARIANTS in the step")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="20-replay timings a candidate a round (the min)")
    ap.add_argument("--margin", type=float, default=0.003, help="relative gain a change needs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    device = torch.device("cuda")
    start = GemmTable.load(args.gemm_config, device)
    if start is None:
        ap.error(f"{args.gemm_config}: missing or tuned on another GPU (run `shardline tune-gemm`)")
    decode_bench.GEMM_CONFIG = args.gemm_config
    pipeline = decode_bench.build("llama3-8b", max_num_seqs=max(args.batch, 16))
    shapes = linear_shapes(ModelConfig(**SHAPES["llama3-8b"]))
    dtype = torch.bfloat16
    table = copy.deepcopy(start)
    b = args.batch
    for name in args.linears.split(","):
        n, k = shapes[name]
        entry_key = key(n, k, dtype, dtype)
        current = table.choice(n, k, dtype, dtype, b) or {"impl": "cublas", "config": None}  # the default
        cands = candidates(current, b)
        times: list[list[float]] = [[] for _ in cands]
        for _ in range(args.rounds):
            for i, c in enumerate(cands):
                trial = copy.deepcopy(table)
                trial.entries.setdefault(entry_key, {})[b] = dict(c, step_ms=None)
                try:
                    times[i].append(step_ms(pipeline, trial, b, args.reps))
                except Exception as exc:  # a tile that does not compile or fit: report it, go on
                    times[i].append(float("inf"))
                    print(json.dumps({"linear": name, "candidate": label(c), "error": str(exc)[:200]}), flush=True)
        med = [statistics.median(t) for t in times]
        best = min(range(len(cands)), key=med.__getitem__)
        for i, c in enumerate(cands):
            print(json.dumps({"linear": name, "batch": b, "candidate": label(c), "step_ms": round(med[i], 4),
                              "rounds": [round(t, 4) for t in times[i]], "current": i == 0}), flush=True)
        if med[best] < med[0] * (1 - args.margin):
            table.entries.setdefault(entry_key, {})[b] = dict(
                {k: v for k, v in cands[best].items() if k in ("impl", "config")}, step_ms=round(med[best], 4),
                replaced=label(cands[0]), replaced_step_ms=round(med[0], 4))
            print(f"{name}: {label(cands[0])} -> {label(cands[best])}, step {med[0]:.4f} -> {med[best]:.4f} ms",
                  flush=True)
        else:
            print(f"{name}: keeps {label(cands[0])} ({med[0]:.4f} ms; best other {med[best]:.4f})", flush=True)
    if args.attention:
        times = [[] for _ in ATTENTION_VARIANTS]
        for _ in range(args.rounds):
            for i, variant in enumerate(ATTENTION_VARIANTS):
                times[i].append(step_ms(pipeline, table, b, args.reps, variant))
        for variant, t in zip(ATTENTION_VARIANTS, times):
            print(json.dumps({"attention": variant, "batch": b, "step_ms": round(statistics.median(t), 4),
                              "rounds": [round(x, 4) for x in t]}), flush=True)
        step_ms(pipeline, table, b, 1)  # back to the defaults
    table.save(args.out)
    print(f"wrote {args.out}", flush=True)
    for _ in range(2):  # whole decode runs, the bar's measure, alternated
        for tag, t in (("start", start), ("stepped", table)):
            pipeline.engines[0].model.configure_gemms(t)
            pipeline.engines[0].graphs.reset()
            ms = decode_bench.decode_ms_per_step(pipeline, b)
            print(json.dumps({"table": tag, "batch": b, "decode_ms_per_step": round(ms, 3),
                              "tok_s": round(b * 1e3 / ms, 1)}), flush=True)


if __name__ == "__main__":
    main()
