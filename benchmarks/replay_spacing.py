"""The decode loop's step against its captured graph replayed back to back and spaced out.

    python -m benchmarks.replay_spacing [--batch 64] [--gemm-config T] [--shape llama3-8b]

decode_bench prints two numbers a batch: ms/step of the decode loop (`LocalPipeline.generate`,
128 + 128 tokens) and "GPU step alone", 20 replays of the captured step back to back (every row
attending over 192 tokens, the loop's mean). At batches 16 and 64 the second has come out 3-5%
above the first on the H200, though the loop replays the same graph: it cannot run faster than
the GPU does. This script times, in one process and in turn:

* the decode loop (decode_bench's ms/step: its runs of 128 and of 1 new token, each after the
  prefill of 64 prompts of 128 tokens), at the start and again at the end;
* the graph replayed back to back, 5, 20 and 100 times (a power-limited GPU lowers its clock
  over tens of milliseconds);
* the graph replayed once at a time, the host waiting for it and then sleeping 0.2 or 1 ms before
  the next (each replay timed by CUDA events around it alone);

with the SM clock, power draw and throttle reasons (nvidia-smi) after each, and prints a table.
(The profiler is no help here: its kernel tracing of a 163-kernel graph slows each step by ~30%.)
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from benchmarks import decode_bench
from benchmarks.gpu_state import smi
from shardline import step_tuning


def spaced_ms(graph, replays: int, sleep_s: float) -> float:
    """The median GPU time of one replay when the GPU idles `sleep_s` (plus a host round trip)
    before each."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        time.sleep(sleep_s)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(decode_bench.SHAPES))
    ap.add_argument("--gemm-config", help="a `shardline tune-gemm` table")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch {args.batch}: a batch >= 1")
    decode_bench.GEMM_CONFIG = args.gemm_config
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today()}\n$ {' '.join(sys.argv)}")
    pipeline = decode_bench.build(args.shape)
    rows = []
    loop = decode_bench.decode_ms_per_step(pipeline, args.batch)
    rows.append(("decode loop, ms/step", loop, smi()))
    graph = decode_bench.loaded_graph(pipeline, args.batch, capture=True)
    graph.replay()
    torch.cuda.synchronize()
    for rounds in range(2):
        for n in (5, 20, 100):
            rows.append((f"replay back to back x{n} (round {rounds + 1})", step_tuning.replay_ms(graph, n), smi()))
        for sleep_s in (0.0002, 0.001):
            rows.append((f"replay alone, {sleep_s * 1e3:g} ms idle before each (round {rounds + 1})",
                         spaced_ms(graph, 20, sleep_s), smi()))
    rows.append(("decode loop again, ms/step", decode_bench.decode_ms_per_step(pipeline, args.batch), smi()))
    print(f"\nbatch {args.batch}; nvidia-smi: sm clock, mem clock, power, limit, temp, throttle reasons")
    for name, ms, note in rows:
        print(f"{name:<58} {ms:>7.3f} ms   {note}")


if __name__ == "__main__":
    main()
