"""Where a decode step's GPU time goes: top kernels of one eager step, Llama-3-8B shape.

    python benchmarks/profile_decode.py --batch 1 [--int8]

Runs a decode step (context 256) eagerly under torch.profiler after warm-up and prints the
kernels by total CUDA time, with the share of the step. Use it before changing a hot path.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode_bench import build
from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import SequenceChunk, StageBatch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--rows", type=int, default=18)
    args = ap.parse_args()
    pipeline = build("llama3-8b", int8=args.int8, max_num_seqs=max(args.batch, 16))
    engine = pipeline.engines[0]
    engine.graphs = None  # eager: see every kernel
    greedy = SamplingParams(max_tokens=1)
    prefill = StageBatch([SequenceChunk(f"s{i}", 0, 255, True, greedy) for i in range(args.batch)])
    engine.execute(prefill, torch.randint(0, 1000, (255 * args.batch,)))
    step = StageBatch([SequenceChunk(f"s{i}", 255, 1, True, greedy) for i in range(args.batch)])
    ids = torch.randint(0, 1000, (args.batch,))
    for _ in range(3):
        engine.execute(step, ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.execute(step, ids)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
