"""What a decode step costs between graph replays: the graph boundary and the copies around it.

    python -m benchmarks.graph_boundary [--batch 64] [--gemm-config T] [--steps 2,4] [--rounds 3]

A decode step is one replay of a captured graph, with the step's metadata copied up before it and
its sampled ids copied down after it (cuda_graphs.py, staging.py). Between two steps the GPU
drains the last kernel of one graph, takes the two copies, and launches the next graph, whose
first kernel has no kernel ahead to overlap with (PDL works inside a graph only). This script
times, in one process and alternated over rounds, per step:

* `1 step a replay`: the step's graph replayed back to back (decode_bench's "GPU step alone");
* `1 step a replay, copies`: the same with the decode loop's copy up before each replay and copy of
  the ids down after it, as the engine queues them;
* the copy up alone, and the copy down alone;
* `kernels copy in it`: the step's graph with both copies done by kernels inside it, through
  mapped pinned host memory (the GPU reads the metadata and writes the ids over PCIe: no copy
  engine between the graphs);
* `N steps a replay`: a graph of the same step captured N times over, replayed back to back.

The first minus the last is what the graph boundary costs a step; the second minus the first what
the copies add. The GPU's clock moves with its power draw (step_power.py), so the rounds
alternate the forms and each time carries the SM clock read just after it. Every row attends over `--context` tokens and writes nowhere (slot -1), as
decode_bench's replay does; the steps inside one graph repeat the same step.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch
import triton
import triton.language as tl

from benchmarks import decode_bench
from benchmarks.step_power import smi
from shardline import step_tuning
from shardline.graph_capture import collected_garbage
from shardline.stage_worker.staging import HostStep, TokenReadback


def steps_graph(runner, key: tuple[int, int], n: int) -> torch.cuda.CUDAGraph:
    """The step of graph `key` captured `n` times over in one graph (the runner's pool)."""
    step = runner._step(*key)
    graph = torch.cuda.CUDAGraph()
    with collected_garbage(), torch.cuda.graph(graph, pool=runner.pool):
        for _ in range(n):
            step()
    return graph


def with_copies_ms(runner, key: tuple[int, int], graph: torch.cuda.CUDAGraph, step: HostStep,
                   replays: int = 20, up: bool = True, down: bool = True) -> float:
    """GPU time a replay when each is queued as the decode loop queues a step: its metadata
    (`step`, the inputs the graph already holds) up from a pinned staging slot (`up`), the
    replay, its ids down (TokenReadback; `down`)."""
    b = key[0]
    layout = runner._layout(*key)
    slot, buf = runner.staging.slot()
    layout.fill(buf, step)
    readback = TokenReadback(b, runner.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        if up:
            runner.staging.upload(slot, layout.numel, runner.buffer)
        graph.replay()
        if down:
            readback.start(runner.sampled[:b])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _copy(src: torch.Tensor, dst: torch.Tensor, block: int = 1024) -> None:
    """dst[:] = src[:] by a kernel (either side may be mapped pinned host memory)."""
    n = dst.numel()
    _copy_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block)


def zero_copy_graph(runner, key: tuple[int, int], step: HostStep) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The step's graph with its copies done by kernels inside it: the first reads the step's
    metadata from pinned host memory (mapped: the GPU reads it over PCIe) into the graph's buffer,
    the last writes the sampled ids to pinned host memory. Returns (graph, the host ids)."""
    b = key[0]
    layout = runner._layout(*key)
    mailbox = torch.zeros(layout.numel, dtype=torch.int64, pin_memory=True)
    layout.fill(mailbox.numpy(), step)
    ids_out = torch.zeros(b, dtype=torch.int64, pin_memory=True)
    run = runner._step(*key)
    _copy(mailbox, runner.buffer[:layout.numel])  # compile outside the capture
    _copy(runner.sampled[:b], ids_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with collected_garbage(), torch.cuda.graph(graph, pool=runner.pool):
        _copy(mailbox, runner.buffer[:layout.numel])
        run()
        _copy(runner.sampled[:b], ids_out)
    return graph, ids_out


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
    graphs = {n: steps_graph(runner, key, n) for n in multi}
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    zero_copy, _ = zero_copy_graph(runner, key, step)
    names = ["1 step a replay", "1 step a replay, copies", "1 step, the copy up alone", "1 step, the copy down alone",
             "1 step, kernels copy in it"] + [f"{n} steps a replay" for n in multi]
    runs = {names[0]: lambda: step_tuning.replay_ms(graph, 40),
            names[1]: lambda: with_copies_ms(runner, key, graph, step, 40),
            names[2]: lambda: with_copies_ms(runner, key, graph, step, 40, down=False),
            names[3]: lambda: with_copies_ms(runner, key, graph, step, 40, up=False),
            names[4]: lambda: step_tuning.replay_ms(zero_copy, 40)}
    runs.update({f"{n} steps a replay": (lambda g=g, n=n: step_tuning.replay_ms(g, max(40 // n, 5)) / n)
                 for n, g in graphs.items()})
    times: dict[str, list[tuple[float, str]]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            ms = runs[name]()
            times[name].append((ms, smi().split(",")[0].strip()))  # the SM clock just after
    base = min(t for t, _ in times[names[0]])
    print(f"\nbatch {args.batch} (bucket {key[0]}), context {args.context}; ms a step in each round (the SM "
          f"clock after it), the best, and the best against one step a replay's")
    for name in names:
        row = "  ".join(f"{t:.4f} ({clock})" for t, clock in times[name])
        best = min(t for t, _ in times[name])
        print(f"{name:<28} {row}   best {best:.4f}   {1e3 * (best - base):+.1f} us")

if __name__ == "__main__":
    main()
