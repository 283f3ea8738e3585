"""Where a decode step's kernel boundaries go: every program's timeline in one replay.

    python -m benchmarks.program_trace [--batch 64] [--context 192] [--gemm-config T] [--shape llama3-8b]
                                       [--replays 30] [--out trace.json]
    python -m benchmarks.program_trace --gemm-configs A.json,B.json [--rounds 2] ...  # alternated
    python -m benchmarks.program_trace --attention-configs '[{}, {"NEW_FIRST": true}]' ...  # attention A/B
    python -m benchmarks.program_trace --read trace.json [--sms 132]  # a saved middle layer, by wave (CPU)

The DRAM timeline (benchmarks/dram_timeline.py) shows the products streaming at 90-98% of peak
between kernels and the memory idling at each boundary, ~30 us a layer at batch 64. This script
says what a boundary is made of. It runs with SHARDLINE_TRACE_PROGRAMS=1 (shardline/kernels/trace.py), so
that the split-K GEMM, the ring GEMM and decode attention write, for each program, when it
started, when its PDL wait returned, when its first tiles landed (the ring), when it left its
main loop and when it exited, and its multiprocessor; it captures the step's graph, replays it
back to back and reads the last replay's timelines. Per kernel of a layer (means over the
middle layers), in us:

* critical: how far its last exit lies past the last exit of the kernel before it;
* lead: how long before that exit its first program had started (PDL);
* release: its first wait's return after the kernel before it had wholly exited;
* landed: its first tiles after its wait (median program; the ring only);
* loop: its median program's main loop, from its wait;
* tail: its last exit past its median exit (the spread that the next kernel waits out);
* program: its median program's time from start to exit, and last: the same for the program
  that exited last (a partial last wave shows as a tail of one program's time);
* early: the share of its programs that started 1 us or more before that exit (resident beside
  the kernel ahead, PDL's lead put to work; o's were 13% beside attention, call c0 of 2026-12-02);
* TB/s: a product's weight bytes over its first wait to its last exit, and a program: its bytes
  a program over the median program's wait to exit (GB/s);
* SMs: the multiprocessors its programs ran on.

`--read` takes a file that `--out` wrote and splits each traced table's middle layer (its raw
records) by wave: a program of the second wave starts after the kernel's first exit. Per wave, a
median program's ramp (wait to first tiles: the ring), loop (first tiles, else the wait, to the
loop's end) and epilogue (loop end to exit), and the wave's weight rate (its programs' bytes over
the median loop, times the programs in the wave, at most --sms); the weight bytes come from the
label's N x K at 2 bytes an element (a bf16 model).

Tracing must not change the step: the buffers are allocated empty (a fill kernel would break the
PDL chain) and each program adds a few stores; SHARDLINE_TRACE_PROGRAMS=0 times the same replay
untraced, to compare. %globaltimer ticks at 1 us on some GPUs unless a profiler raises its rate; the script prints the
tick it sees, and the means over ~30 layers resolve below it.
"""

from __future__ import annotations

import os

os.environ.setdefault("SHARDLINE_TRACE_PROGRAMS", "1")  # read once, when the kernels are imported

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from shardline.kernels.trace import EXIT, FIELDS, FIRST, LOOP_END, SM, START, WAITED  # noqa: E402

COLUMNS = ("critical", "lead", "release", "landed", "loop", "tail", "program", "last", "early", "TB/s", "a program")
EARLY_NS = 1000  # "early": a program that started this long before the kernel ahead had wholly exited


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(launches: list[tuple[str, torch.Tensor]], weight_bytes: dict[str, int] | None = None) -> list[dict]:
    """One dict a launch, in order: the columns above (us) from [programs, FIELDS] ns records, each
    launch measured against the one before it (the first against its own start); the rates where
    `weight_bytes` has the launch's label."""
    rows, prev_exit = [], None
    weight_bytes = weight_bytes or {}
    for label, rec in launches:
        rec = rec.to("cpu", torch.int64)
        start, waited, first, loop_end, exit_ = (rec[:, i].tolist() for i in (START, WAITED, FIRST, LOOP_END, EXIT))
        last_exit = max(exit_)
        before = prev_exit if prev_exit is not None else min(start)
        landed = [f - w for f, w in zip(first, waited) if f > 0]
        rows.append({
            "kernel": label, "programs": rec.shape[0], "sms": len(set(rec[:, SM].tolist())),
            "critical": (last_exit - before) / 1e3,
            "lead": (before - min(start)) / 1e3,
            "release": (min(waited) - before) / 1e3,
            "landed": _median(landed) / 1e3 if landed else None,
            "loop": _median([e - w for e, w in zip(loop_end, waited)]) / 1e3,
            "tail": (last_exit - _median(exit_)) / 1e3,
            "program": _median([e - s for e, s in zip(exit_, start)]) / 1e3,
            "last": (last_exit - start[exit_.index(last_exit)]) / 1e3,
            "early": sum(s <= before - EARLY_NS for s in start) / len(start),
            "span_end_ns": last_exit,
        })
        nbytes = weight_bytes.get(label)
        busy = _median([e - w for e, w in zip(exit_, waited)])
        rows[-1]["TB/s"] = nbytes / (last_exit - min(waited)) / 1e3 if nbytes else None
        rows[-1]["a program"] = nbytes / rec.shape[0] / busy if nbytes and busy > 0 else None
        prev_exit = last_exit
    return rows


def by_kernel(rows: list[dict], skip_ends: int = 1) -> list[dict]:
    """Means of each kernel label's rows, in the order labels first appear, leaving out the first
    and last `skip_ends` occurrences of a repeated label (the layers next to the step's ends)."""
    order, groups = [], {}
    for r in rows:
        if r["kernel"] not in groups:
            order.append(r["kernel"])
            groups[r["kernel"]] = []
        groups[r["kernel"]].append(r)
    out = []
    for k in order:
        g = groups[k]
        if len(g) > 2 * skip_ends + 2:
            g = g[skip_ends:len(g) - skip_ends]
        mean = {c: (statistics.fmean([r[c] for r in g if r[c] is not None])
                    if any(r[c] is not None for r in g) else None) for c in COLUMNS}
        out.append({"kernel": k, "launches": len(groups[k]), "programs": g[0]["programs"],
                    "sms": max(r["sms"] for r in g), **mean})
    return out


def timer_tick_ns(launches: list[tuple[str, torch.Tensor]]) -> int:
    """The smallest nonzero step between distinct timestamps seen (the timer's tick, roughly)."""
    stamps = sorted({int(t) for _, rec in launches for t in rec[:, :SM].flatten().tolist() if t > 0})
    steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    return min(steps) if steps else 0


def _shape_bytes(label: str, elem_bytes: int = 2) -> int | None:
    """A product label's weight bytes ('ring 6144x4096' -> 6144 * 4096 * elem_bytes), else None."""
    last = label.split()[-1]
    n, x, k = last.partition("x")
    return int(n) * int(k) * elem_bytes if x and n.isdigit() and k.isdigit() else None


def waves(label: str, records: list[list[int]], sms: int = 132) -> list[dict]:
    """One kernel launch's raw records split by wave (a second-wave program starts after the
    launch's first exit): per wave its programs and median ramp, loop and epilogue (us), and the
    weight rate of its loops (TB/s, None when the label names no product)."""
    first_exit = min(r[EXIT] for r in records)
    groups = [[r for r in records if r[START] <= first_exit], [r for r in records if r[START] > first_exit]]
    nbytes = _shape_bytes(label)
    out = []
    for wave, rows in enumerate(groups, 1):
        if not rows:
            continue
        ramp = [r[FIRST] - r[WAITED] for r in rows if r[FIRST] > 0]
        loop = _median([r[LOOP_END] - (r[FIRST] if r[FIRST] > 0 else r[WAITED]) for r in rows])
        rate = (nbytes / len(records) / loop * min(len(rows), sms) / 1e3) if nbytes and loop > 0 else None
        out.append({"kernel": label, "wave": wave, "programs": len(rows),
                    "ramp": _median(ramp) / 1e3 if ramp else None, "loop": loop / 1e3,
                    "epilogue": _median([r[EXIT] - r[LOOP_END] for r in rows]) / 1e3, "TB/s": rate})
    return out


def read(path: str, sms: int) -> str:
    """What --read prints for a file that --out wrote."""
    with open(path) as f:
        saved = json.load(f)
    lines = [f"{saved.get('gpu')}  {saved.get('date')}  (read from {path})", f"$ {saved.get('command')}"]
    for t in saved.get("traces", []):
        if "middle_layer_records" not in t:
            continue
        lines.append(f"\n{t['table']}: replay {t['replay_ms']:.3f} ms; a middle layer by wave")
        lines.append(f"{'kernel':<24} {'wave':>4} {'programs':>8} {'ramp':>6} {'loop':>7} {'epilogue':>8} {'TB/s':>6}")
        for key, records in t["middle_layer_records"].items():
            for w in waves(key.split(": ", 1)[-1], records, sms):
                cells = [f"{w[c]:.2f}" if w[c] is not None else "-" for c in ("ramp", "loop", "epilogue", "TB/s")]
                lines.append(f"{w['kernel']:<24} {w['wave']:>4} {w['programs']:>8} {cells[0]:>6} {cells[1]:>7} "
                             f"{cells[2]:>8} {cells[3]:>6}")
    return "\n".join(lines)


def format_table(kernels: list[dict]) -> str:
    head = f"{'kernel':<24} {'launches':>8} {'programs':>8} {'SMs':>4} " + " ".join(f"{c:>9}" for c in COLUMNS)
    lines = [head]
    for k in kernels:
        cells = " ".join(f"{k[c]:>9.2f}" if k[c] is not None else f"{'-':>9}" for c in COLUMNS)
        lines.append(f"{k['kernel']:<24} {k['launches']:>8} {k['programs']:>8} {k['sms']:>4} {cells}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=192, help="every row attends over this many tokens")
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--gemm-config", help="a `shardline tune-gemm` table")
    ap.add_argument("--gemm-configs",
                    help="tables to trace in turn, comma-separated (the first also builds the engine)")
    ap.add_argument("--attention-configs", type=json.loads,
                    help="decode attention overrides to trace in turn, a JSON list of objects (decode_bench's "
                         "keys); with --gemm-configs, paired with the tables one to one")
    ap.add_argument("--rounds", type=int, default=1, help="with several variants: passes over them")
    ap.add_argument("--replays", type=int, default=30, help="back-to-back replays; the last one is read")
    ap.add_argument("--out", help="write every launch's summary here (JSON)")
    ap.add_argument("--read", metavar="JSON", help="print a file --out wrote, its middle layer by wave (no GPU)")
    ap.add_argument("--sms", type=int, default=132, help="with --read: the GPU's multiprocessors")
    args = ap.parse_args()
    if args.read:
        try:
            print(read(args.read, args.sms))
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--read {args.read}: {e!r}; give a file that `program_trace --out` wrote")
        return
    if args.batch < 1 or args.context < 1 or args.replays < 1 or args.rounds < 1:
        ap.error(f"--batch {args.batch}, --context {args.context}, --replays {args.replays}, --rounds {args.rounds}: "
                 "each >= 1")
    if args.gemm_config and args.gemm_configs:
        ap.error("--gemm-config or --gemm-configs, not both")
    tables = args.gemm_configs.split(",") if args.gemm_configs else [args.gemm_config]
    from benchmarks import decode_bench
    attention = args.attention_configs
    if attention is not None:
        problems = ([decode_bench.attention_config_problem(c) for c in attention] if isinstance(attention, list)
                    else ["a list"])
        if not attention or any(problems):
            ap.error(f"--attention-configs takes a JSON list of objects ({next((p for p in problems if p), 'empty')}), "
                     f"e.g. '[{{}}, {{\"NEW_FIRST\": true}}]'; got {attention!r}")
        if len(tables) > 1 and len(tables) != len(attention):
            ap.error(f"--gemm-configs ({len(tables)}) and --attention-configs ({len(attention)}) pair one to one: "
                     "give as many of each")
        tables = tables * len(attention) if len(tables) == 1 else tables
    variants = list(zip(tables, attention or [None] * len(tables)))
    from shardline import step_tuning
    from shardline.gemm_tuning import GemmTable
    from shardline.kernels import trace, triton_attention
    if args.shape not in decode_bench.SHAPES:
        ap.error(f"--shape {args.shape}: one of {', '.join(sorted(decode_bench.SHAPES))}")
    if not torch.cuda.is_available():
        sys.exit("program_trace times kernels on a GPU; this machine has none")
    decode_bench.GEMM_CONFIG = tables[0]
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today()}\n$ {' '.join(sys.argv)}")
    pipeline = decode_bench.build(args.shape)
    engine = pipeline.engines[0]
    loaded = {t: GemmTable.load(t, engine.device) if t else None for t in tables}
    results = []
    for _ in range(args.rounds if len(variants) > 1 else 1):
        for t, override in variants:
            if len(set(tables)) > 1:
                engine.model.configure_gemms(loaded[t])
            if override is not None:
                triton_attention.DECODE_OVERRIDE = dict(override)
            engine.graphs.reset()
            label = t if override is None else f"{t} attention {json.dumps(override)}"
            results.append(trace_step(engine, label, args, trace, step_tuning))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                       "command": " ".join(sys.argv), "fields": FIELDS, "traces": results}, f, indent=1)


def trace_step(engine, table: str | None, args, trace, step_tuning) -> dict:
    """Capture, replay and read one step's timelines with the engine's current table; print them."""
    if not trace.TRACE_PROGRAMS:  # SHARDLINE_TRACE_PROGRAMS=0: the same replay untraced, to compare
        graph = step_tuning.loaded_graph(engine, args.batch, args.context, capture=True)
        replay = step_tuning.replay_ms(graph, args.replays)
        print(f"\n{table}: batch {args.batch}, context {args.context}: replay {replay:.3f} ms untraced "
              "(SHARDLINE_TRACE_PROGRAMS=0)")
        return {"table": table, "replay_ms": replay}
    trace.clear()
    # The capture runs the step twice eagerly (compiles) and then records it: the last third of
    # the launches are the graph's.
    graph = step_tuning.loaded_graph(engine, args.batch, args.context, capture=True)
    launches = trace.launches()
    per_step = len(launches) // 3
    assert per_step and len(launches) == 3 * per_step, f"{len(launches)} traced launches: not three steps"
    launches = launches[2 * per_step:]
    replay = step_tuning.replay_ms(graph, args.replays)
    torch.cuda.synchronize()
    rows = summarise(launches, trace.weight_bytes())
    kernels = by_kernel(rows)
    tick = timer_tick_ns(launches)
    step_us = (rows[-1]["span_end_ns"] - min(int(rec[:, START].min()) for _, rec in launches)) / 1e3
    print(f"\n{table}: batch {args.batch}, context {args.context}: replay {replay:.3f} ms; traced launches "
          f"{len(rows)} a step, first start to last exit {step_us:.0f} us; timer tick ~{tick} ns")
    print(format_table(kernels), flush=True)
    middle = len(launches) // 2 // 5 * 5  # the five launches of a middle layer, raw
    raw = {f"{i}: {label}": rec.tolist() for i, (label, rec) in enumerate(launches[middle:middle + 5], middle)}
    return {"table": table, "replay_ms": replay, "timer_tick_ns": tick, "kernels": kernels, "launches": rows,
            "middle_layer_records": raw}


if __name__ == "__main__":
    main()
