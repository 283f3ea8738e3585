"""Where a decode step's time goes, Llama-3-8B shape (or another of decode_bench's: --shape gptj-6b).

    python -m benchmarks.profile_decode --batch 1 [--quant int8]    # GPU kernels of one eager step
    python -m benchmarks.profile_decode --batch 256 --generate      # host + device of whole steps
    python -m benchmarks.profile_decode --batch 64 --gemm-config benchmarks/results/gemm-h200-decode.json
    python -m benchmarks.profile_decode --batch 64 --timeline --gemm-config ...   # replays of the graph
    python -m benchmarks.profile_decode --batch 64 --timeline --contexts 1,128,256 --gemm-config ...

The first mode runs a decode step (context 256) eagerly under torch.profiler after warm-up and
prints the kernels by CUDA time. The second profiles `LocalPipeline.generate` as the benchmark
runs it (graphs on) with CPU activity too, and writes a Chrome trace: the host work between graph
replays — the gap between measured ms/step and graph-replay ms in docs/benchmarks.md — shows there;
it also prints the critical path a step of every device activity in the decode window, the graph's
kernels and what the host queues around each replay alike, each labelled by the one before it.
The third replays the captured decode graph (context 192, as decode_bench's graph_replay_ms) and
splits its wall time among the kernels on the critical path: with programmatic dependent launch a
kernel starts before the one ahead of it ends and waits, so its own duration overstates what it
costs; `critical_path` charges each kernel only the time by which it extends the step. With
`--contexts`, the same at each context, then a straight line through each kernel's critical time
against the context: its slope is what a token of context costs (attention streams K/V), its
intercept what the kernel costs with no context to read (its boundary, prologue and epilogue).
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import decode_bench
from benchmarks.decode_bench import build
from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import SequenceChunk, StageBatch


def print_gpu_idle(prof, steps: int) -> None:
    """How much of the profiled wall time the GPU spent idle: merged device-activity intervals
    against the span from the first to the last one, per decode step."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not spans:
        print("no device activity recorded")
        return
    busy, (cur_s, cur_e) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    wall = spans[-1][1] - spans[0][0]
    print(f"device busy {busy / 1e3:.2f} ms of {wall / 1e3:.2f} ms ({busy / wall:.0%}); "
          f"per step ~{wall / steps / 1e3:.3f} ms wall, {(wall - busy) / steps / 1e3:.3f} ms idle")


def critical_path(spans: list[tuple[str, float, float]]) -> tuple[dict[str, list[float]], float, float]:
    """Kernels (name, start, end) of one stream, in any order -> ({name: [count, sum of durations,
    critical-path time]}, idle time, wall time). A kernel's critical-path time is how far its end
    lies past every earlier kernel's end; idle is time covered by no kernel. The critical-path
    times and the idle time add up to the wall time."""
    spans = sorted(spans, key=lambda s: (s[1], s[2]))
    stats: dict[str, list[float]] = {}
    idle, reach = 0.0, spans[0][1] if spans else 0.0
    for name, start, end in spans:
        idle += max(0.0, start - reach)
        own = max(0.0, end - max(start, reach))
        reach = max(reach, end)
        st = stats.setdefault(name, [0, 0.0, 0.0])
        st[0] += 1
        st[1] += end - start
        st[2] += own
    wall = reach - spans[0][1] if spans else 0.0
    return stats, idle, wall


def print_decode_window(prof, num_layers: int, rows: int = 18) -> None:
    """Critical-path time a decode step of every device activity (kernels and copies, inside the
    graph or not) from the first decode attention kernel on: the graph's kernels, and the work the
    host queues around each replay (input copies, sampling, the token readback)."""
    spans = sorted((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    decode = [s for s in spans if "_decode_kernel" in s[0]]
    if not decode:
        print("no decode attention kernel recorded")
        return
    t0 = min(s[1] for s in decode)
    window = sorted((s for s in spans if s[1] >= t0), key=lambda s: s[1])
    steps = len(decode) / num_layers
    stats, idle, wall = critical_path(by_predecessor(window))
    print(f"\ndecode window: {steps:.1f} steps, {wall / steps / 1e3:.3f} ms a step, {idle / steps:.1f} us of it idle")
    print(f"{'activity':<60} {'a step':>6} {'us each':>8} {'crit us/step':>12}")
    for name, (n, total, own) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:rows]:
        print(f"{name[:60]:<60} {n / steps:>6.1f} {total / n:>8.2f} {own / steps:>12.1f}")


def by_predecessor(spans: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Spans (in start order) renamed "kernel < the kernel before it", which tells one kernel's
    uses apart: the split-K GEMM after the ring is gate/up, after itself down, after a norm the
    head."""
    def short(name: str) -> str:
        return name.split("(")[0].split("<")[0].replace("void ", "")[:28]
    return [(f"{short(name)} < {short(spans[i - 1][0]) if i else '-'}", start, end)
            for i, (name, start, end) in enumerate(spans)]


def timeline_stats(pipeline, batch: int, replays: int = 5, context: int = 192
                   ) -> tuple[dict[str, list[float]], float, float, list[tuple[str, float, float]]] | None:
    """(critical_path's stats, idle, wall, the kernels' spans) over `replays` replays of the
    captured step with every row attending over `context` tokens; None if nothing was recorded."""
    graph = decode_bench.loaded_graph(pipeline, batch, context, capture=True)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))]
    if not spans:
        return None
    return (*critical_path(by_predecessor(sorted(spans, key=lambda s: s[1]))), spans)


def print_timeline(pipeline, batch: int, replays: int = 5, context: int = 192, rows: int = 18) -> None:
    got = timeline_stats(pipeline, batch, replays, context)
    if got is None:
        print("the profiler recorded no kernels of the graph replays")
        return
    stats, idle, wall, spans = got
    print(f"batch {batch}, context {context}: {wall / replays / 1e3:.3f} ms a replay, "
          f"{idle / replays:.1f} us of it idle; {len(spans) // replays} kernels a replay")
    print(f"{'kernel':<60} {'a step':>6} {'us each':>8} {'crit us/step':>12} {'share':>6}")
    for name, (n, total, own) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:rows]:
        print(f"{name[:60]:<60} {n / replays:>6.0f} {total / n:>8.2f} {own / replays:>12.1f} {own / wall:>6.1%}")
    first = sorted(spans, key=lambda s: s[1])[: len(spans) // replays]
    layer = first[len(first) // 2:][:14]  # a stretch from the middle of one replay
    t0 = layer[0][1]
    print("\na stretch of one replay (us from its first kernel's start):")
    for name, start, end in layer:
        print(f"  {start - t0:>8.1f} {end - t0:>8.1f}  {name[:70]}")


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points (xs, ys)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def print_context_fit(pipeline, batch: int, contexts: list[int], replays: int = 5, rows: int = 8) -> None:
    """Each kernel's critical time a step at each context, and its line against the context."""
    per: dict[str, dict[int, float]] = {}
    walls = {}
    for ctx in contexts:
        got = timeline_stats(pipeline, batch, replays, ctx)
        if got is None:
            print(f"context {ctx}: the profiler recorded no kernels")
            return
        stats, _, wall, _ = got
        walls[ctx] = wall / replays
        for name, (_, _, own) in stats.items():
            per.setdefault(name, {})[ctx] = own / replays
    print(f"batch {batch}: critical us a step by context; the line's intercept (us at context 0) and slope (us a token)")
    print(f"{'kernel':<60} " + " ".join(f"{c:>9}" for c in contexts) + f" {'at 0':>9} {'a token':>8}")
    print(f"{'the replay':<60} " + " ".join(f"{walls[c]:>9.1f}" for c in contexts))
    top = sorted(per.items(), key=lambda kv: -max(kv[1].values()))[:rows]
    for name, by_ctx in top:
        ys = [by_ctx.get(c, 0.0) for c in contexts]
        a, b = fit_line([float(c) for c in contexts], ys)
        print(f"{name[:60]:<60} " + " ".join(f"{y:>9.1f}" for y in ys) + f" {a:>9.1f} {b:>8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(decode_bench.SHAPES),
                    help="a model shape decode_bench builds")
    ap.add_argument("--quant", choices=["int8", "fp8"], help="weight-only quantization")
    ap.add_argument("--rows", type=int, default=18)
    ap.add_argument("--generate", action="store_true", help="profile whole generate() steps, host included")
    ap.add_argument("--timeline", action="store_true", help="replay the captured decode graph; kernels on the critical path")
    ap.add_argument("--contexts", help="with --timeline: comma-separated contexts (at least two) to fit each "
                    "kernel's critical time against, e.g. 1,128,256; contexts in one graph bucket (up to 256) "
                    "share the attention's splits")
    ap.add_argument("--trace", default="decode_trace.json")
    ap.add_argument("--gemm-config", help="use `shardline tune-gemm` choices, as decode_bench.py does")
    ap.add_argument("--attention-config", default="{}",
                    help="decode attention keys over the kernel's choice, as one of decode_bench's "
                         '--attention-configs, e.g. \'{"OPAQUE_BT": true}\'')
    args = ap.parse_args()
    contexts = None
    if args.contexts is not None:
        try:
            contexts = [int(c) for c in args.contexts.split(",")]
        except ValueError:
            contexts = []
        if not args.timeline or len(set(contexts)) < 2 or min(contexts) < 1:
            ap.error(f"--contexts {args.contexts!r}: give --timeline and at least two distinct contexts >= 1, "
                     "e.g. --timeline --contexts 1,128,256")
    attention_config = decode_bench.parse_attention_config(ap, args.attention_config)
    if attention_config:
        decode_bench.use_attention_config(attention_config)
    decode_bench.GEMM_CONFIG = args.gemm_config
    pipeline = build(args.shape, quantization=f"{args.quant}-weight-only" if args.quant else "none",
                     max_num_seqs=max(args.batch, 16))
    if args.generate:
        prompts = torch.randint(0, 1000, (args.batch, 128)).tolist()
        pipeline.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))  # compile, capture
        pipeline.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            pipeline.generate(prompts, SamplingParams(max_tokens=33, ignore_eos=True))
        prof.export_chrome_trace(args.trace)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70))
        print_gpu_idle(prof, steps=32)
        print_decode_window(prof, pipeline.engines[0].spec.num_layers, rows=args.rows)
        return
    if args.timeline:
        if contexts:
            print_context_fit(pipeline, args.batch, contexts, rows=args.rows)
        else:
            print_timeline(pipeline, args.batch, rows=args.rows)
        return
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
