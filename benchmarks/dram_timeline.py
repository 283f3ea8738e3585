"""Where DRAM idles inside one captured decode step: Nsight Compute's PM sampling of the whole graph.

    ncu --clock-control none --graph-profiling graph --nvtx --nvtx-include prof_step/ \\
        --section PmSampling -o step python -m benchmarks.dram_timeline run --batch 64 \\
        --gemm-config benchmarks/results/gemm-h200-decode.json
    python -m benchmarks.dram_timeline read step.ncu-rep [--layer 10]

`run` builds the Llama-3-8B engine (decode_bench's), loads the captured step so that every row
attends over 192 tokens (the replay profile_decode times), and replays it once inside the NVTX range
`prof_step`: ncu profiles that graph launch as one workload, sampling the memory system every ~3 µs.

`read` (needs ncu's `ncu_report` module, found under /opt/nvidia/nsight-compute/*/extras/python)
puts each kernel's end beside the samples and prints, per kernel kind (named with the kernel
before it, as profile_decode does), its share of the step, the DRAM read rate (% of peak) over the
stretch it alone extends the step (from the previous kernel's end to its own) and the time that
stretch loses against the step's steady rate (the samples' 90th percentile: what the products
stream at between boundaries), then one layer's samples, each with the kernel whose stretch holds
it. ncu times the graph with its clocks and
counters on, so the step runs a little slower than in a plain replay.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections import defaultdict

DRAM = "dramc__read_throughput.avg.pct_of_peak_sustained_elapsed"
SERIES = {"dram": DRAM, "l2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
          "tensor": "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed",
          "ctas": "gr__ctas_launched_realtime.sum"}


def run(args: argparse.Namespace) -> None:
    import torch

    from benchmarks import decode_bench
    if not torch.cuda.is_available():
        sys.exit("dram_timeline run replays a decode step on a CUDA GPU; none is visible")
    decode_bench.GEMM_CONFIG = args.gemm_config
    pipeline = decode_bench.build("llama3-8b", max_num_seqs=args.batch)
    graph = decode_bench.loaded_graph(pipeline, args.batch, args.context, capture=True)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof_step")
    graph.replay()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def _values(metric, kind: str) -> list:
    get = {"u": metric.as_uint64, "d": metric.as_double, "s": metric.as_string}[kind]
    return [get(i) for i in range(metric.num_instances())]


def load(path: str) -> tuple[dict[str, tuple[list[int], list[float]]], list[tuple[str, int, int]]]:
    """({series: (sample times in ns, values)}, [(kernel name, start ns, end ns)]) of the report's
    first workload."""
    sys.path += [p for p in glob.glob("/opt/nvidia/nsight-compute/*/extras/python") if p not in sys.path]
    try:
        import ncu_report
    except ImportError:
        sys.exit("dram_timeline read needs Nsight Compute's ncu_report module (its extras/python folder, "
                 "looked for under /opt/nvidia/nsight-compute/*): read the report where ncu is installed")
    try:
        action = ncu_report.load_report(path).range_by_idx(0).action_by_idx(0)
    except FileNotFoundError as e:
        sys.exit(f"dram_timeline read: {e}")
    by_suffix = {name.split("TriageCompute.")[-1]: name for name in action.metric_names()}
    missing = [suffix for suffix in SERIES.values() if suffix not in by_suffix]
    if missing:
        sys.exit(f"{path} has no PM sampling of {missing[0]}: profile with --graph-profiling graph "
                 "--section PmSampling (the command in this module's docstring)")
    series = {}
    for label, suffix in SERIES.items():  # a sample's time is its correlation id (0: no time, dropped)
        m = action.metric_by_name(by_suffix[suffix])
        pairs = [(t, v) for t, v in zip(_values(m.correlation_ids(), "u"), _values(m, "d")) if t]
        series[label] = ([t for t, _ in pairs], [v for _, v in pairs])
    names = _values(action.metric_by_name("launch__kernel_name"), "s")
    # A kernel's timestamps are the correlation ids of these metrics (their values count the kernels).
    starts = _values(action.metric_by_name("profiler__timestamp_workload_start_0").correlation_ids(), "u")
    ends = _values(action.metric_by_name("profiler__timestamp_workload_end_0").correlation_ids(), "u")
    kernels = sorted(zip(names, starts, ends), key=lambda k: k[1])
    return series, kernels


def mean_over(times: list[int], values: list[float], lo: int, hi: int) -> float | None:
    """The samples' mean over [lo, hi), each weighted by how much of its interval lies inside."""
    total = weight = 0.0
    for i in range(len(times) - 1):
        overlap = min(hi, times[i + 1]) - max(lo, times[i])
        if overlap > 0:
            total += values[i] * overlap
            weight += overlap
    return total / weight if weight else None


def read(args: argparse.Namespace) -> None:
    report(*load(args.report), args.layer)


def report(series: dict[str, tuple[list[int], list[float]]], kernels: list[tuple[str, int, int]], layer: int) -> None:
    """Print what `read` prints from `load`'s samples and kernels."""
    times, dram = series["dram"]
    short = [n.split("(")[0].strip().removeprefix("void ")[:28] for n, _, _ in kernels]
    t0, t_end = kernels[0][1], max(e for _, _, e in kernels)
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # count, critical ns, dram x ns
    reach, prev = t0, "-"
    for (_, start, end), name in zip(kernels, short):
        if end > reach:
            pct = mean_over(times, dram, reach, end)
            s = stats[f"{name} < {prev}"]
            s[0] += 1
            s[1] += end - reach
            s[2] += (pct or 0.0) * (end - reach)
            reach = end
        prev = name
    wall = t_end - t0
    inside = sorted(v for t, v in zip(times, dram) if t0 <= t <= t_end)
    steady = inside[int(0.9 * (len(inside) - 1))] if inside else 100.0
    print(f"{len(kernels)} kernels, {wall / 1e3:.1f} us; DRAM read {mean_over(times, dram, t0, t_end):.1f}% of peak "
          f"over the step ({len(times)} samples, {(times[-1] - times[0]) / max(len(times) - 1, 1) / 1e3:.2f} us apart); "
          f"steady rate (the samples' 90th percentile) {steady:.1f}%")
    rows = []  # (kind, count, critical ns, DRAM %, ns below the steady rate)
    for key, (n, crit, weighted) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        pct = weighted / crit if crit else 0.0
        rows.append((key, n, crit, pct, max(0.0, crit * (1 - pct / steady))))
    lost = sum(r[4] for r in rows)
    print(f"below the steady rate: {lost / 1e3:.1f} us of the step; at that rate throughout, {(wall - lost) / 1e3:.1f} us")
    print(f"{'kernel < the one before':<60}{'n':>4}{'crit us':>9}{'share':>7}{'DRAM %':>8}{'below steady, us':>18}")
    for key, n, crit, pct, below in rows:
        print(f"{key:<60}{n:>4}{crit / 1e3:>9.1f}{100 * crit / wall:>6.1f}%{pct:>8.1f}{below / 1e3:>18.1f}")
    # One layer's samples, each labelled with the kernel whose critical stretch holds it. A kernel's
    # start in the report is its launch (with PDL, long before it runs), so stretches go by ends.
    ends = [e for _, _, e in kernels]
    per_layer = 5  # qkv, attention, o, gate/up, down, after the step's first kernel
    first = 1 + per_layer * layer
    if first + per_layer >= len(kernels):
        return
    lo, hi = ends[first - 1], ends[first + per_layer - 1]
    print(f"\nlayer {layer}: its samples, us from the step's start, and the kernel extending the step in each")
    for i in range(len(times) - 1):
        mid = (times[i] + times[i + 1]) // 2
        if lo <= mid <= hi:
            j = next(j for j, e in enumerate(ends) if e >= mid)
            vals = " ".join(f"{label} {series[label][1][i]:6.1f}" for label in SERIES)
            print(f"{(times[i] - t0) / 1e3:8.1f}  {vals}  {short[j]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="replay the step once in the NVTX range prof_step (under ncu)")
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--context", type=int, default=192)
    r.add_argument("--gemm-config", help="a tune-gemm table, as decode_bench takes")
    d = sub.add_parser("read", help="the DRAM read rate per kernel and one layer's samples, from ncu's report")
    d.add_argument("report")
    d.add_argument("--layer", type=int, default=10)
    args = ap.parse_args(argv)
    if args.cmd == "run" and (args.batch < 1 or args.context < 1):
        ap.error(f"--batch {args.batch}, --context {args.context}: both at least 1")
    run(args) if args.cmd == "run" else read(args)


if __name__ == "__main__":
    main()
