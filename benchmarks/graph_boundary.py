"""What a decode step costs between graph replays: the graph boundary and the step's copies.

    python -m benchmarks.graph_boundary [--batch 64] [--gemm-config T] [--steps 2,4] [--rounds 3]

A decode step is one replay of a captured graph. The graph's first kernel takes the step's
metadata from a pinned host mailbox and its last writes the sampled ids to pinned host memory
(shardline/kernels/step_io.py, cuda_graphs.py). Until commit b101153 the metadata went up by a copy before
each replay and the ids came down by a copy after it: two copy-engine round trips between graphs. This script times, in one process and alternated over rounds, per step:

* `the engine's graph`: the runner's graph, its I/O kernels in it, replayed back to back;
* `the step alone`: the same step captured with no I/O (the kernels between the two ends);
* `the step alone, copies`: that graph with the former copy up before each replay and copy of
  the ids down after it, as the engine used to queue them; and each copy alone;
* `N steps a graph`: the bare step captured N times over in one graph (N - 1 graph boundaries
  fewer).

The engine's graph minus the step alone is what the I/O kernels cost; the copies' rows what the
copies did; the step alone minus N steps a graph what a graph boundary costs. The GPU's clock
moves with its power draw (step_power.py), so the rounds alternate the forms and each carries the
SM clock read just after it. Every row attends over `--context` tokens and writes nowhere (slot
-1), as decode_bench's replay does.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from benchmarks import decode_bench
from benchmarks.gpu_state import smi
from shardline import step_tuning
from shardline.graph_capture import collected_garbage
from shardline.stage_worker.staging import HostStep, PinnedStaging, TokenReadback


def steps_graph(runner, key: tuple[int, int], n: int) -> torch.cuda.CUDAGraph:
    """The step of graph `key`, without its I/O kernels, captured `n` times over in one graph."""
    step = runner._step(*key)
    graph = torch.cuda.CUDAGraph()
    with collected_garbage(), torch.cuda.graph(graph, pool=runner.pool):
        for _ in range(n):
            step()
    return graph


def with_copies_ms(runner, key: tuple[int, int], graph: torch.cuda.CUDAGraph, step: HostStep,
                   replays: int = 20, up: bool = True, down: bool = True) -> float:
    """GPU time a replay of the bare step when each is queued as the engine queued a step before
    the mailbox: its metadata (`step`, the inputs the graph already holds) copied up from a
    pinned staging slot (`up`), the replay, its ids copied down (TokenReadback; `down`)."""
    b = key[0]
    layout = runner._layout(*key)
    staging = PinnedStaging(layout.numel, runner.device)
    slot, buf = staging.slot()
    layout.fill(buf, step)
    readback = TokenReadback(b, runner.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        if up:
            staging.upload(slot, layout.numel, runner.buffer)
        graph.replay()
        if down:
            readback.start(runner.sampled[:b])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(decode_bench.SHAPES))
    ap.add_argument("--gemm-config", help="a `shardline tune-gemm` table")
    ap.add_argument("--steps", default="2,4", help="steps a graph for the multi-step graphs, e.g. 2,4")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    try:
        multi = [int(s) for s in args.steps.split(",")]
    except ValueError:
        multi = []
    if not multi or min(multi) < 2:
        ap.error(f"--steps {args.steps!r}: steps a graph, each >= 2, separated by commas, e.g. 2,4")
    for flag, value in (("--batch", args.batch), ("--context", args.context), ("--rounds", args.rounds)):
        if value < 1:
            ap.error(f"{flag} {value}: a value >= 1")
    if not torch.cuda.is_available():
        ap.error("graph_boundary replays captured decode graphs on a CUDA GPU; none is visible")
    decode_bench.GEMM_CONFIG = args.gemm_config
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today()}\n$ {' '.join(sys.argv)}")
    pipeline = decode_bench.build(args.shape)
    engine = pipeline.engines[0]
    graph = step_tuning.loaded_graph(engine, args.batch, args.context, capture=True)
    runner = engine.graphs
    key = runner.buckets(args.batch, args.context)
    step = step_tuning.loaded_step(engine, args.batch, args.context)
    bare = {n: steps_graph(runner, key, n) for n in [1] + multi}
    for g in bare.values():
        g.replay()
    torch.cuda.synchronize()
    names = ["the engine's graph", "the step alone", "the step alone, copies", "the step alone, copy up",
             "the step alone, copy down"] + [f"{n} steps a graph" for n in multi]
    runs = {names[0]: lambda: step_tuning.replay_ms(graph, 40),
            names[1]: lambda: step_tuning.replay_ms(bare[1], 40),
            names[2]: lambda: with_copies_ms(runner, key, bare[1], step, 40),
            names[3]: lambda: with_copies_ms(runner, key, bare[1], step, 40, down=False),
            names[4]: lambda: with_copies_ms(runner, key, bare[1], step, 40, up=False)}
    runs.update({f"{n} steps a graph": (lambda g=g, n=n: step_tuning.replay_ms(g, max(40 // n, 5)) / n)
                 for n, g in bare.items() if n > 1})
    times: dict[str, list[tuple[float, str]]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            ms = runs[name]()
            times[name].append((ms, smi().split(",")[0].strip()))  # the SM clock just after
    base = min(t for t, _ in times[names[1]])
    print(f"\nbatch {args.batch} (bucket {key[0]}), context {args.context}; ms a step in each round (the SM "
          f"clock after it), the best, and the best against the step alone's")
    for name in names:
        row = "  ".join(f"{t:.4f} ({clock})" for t, clock in times[name])
        best = min(t for t, _ in times[name])
        print(f"{name:<28} {row}   best {best:.4f}   {1e3 * (best - base):+.1f} us")


if __name__ == "__main__":
    main()
