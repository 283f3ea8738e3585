"""The decode linears of a whole Llama-3-8B stack at batch 1, as one CUDA graph: how close the
weight stream gets to the copy bandwidth, unfused (cuBLAS + norm and activation kernels) against
the fused GEMV (shardline/kernels/gemv.py) in its Triton and CUDA C forms, with and without programmatic
dependent launch.

    python benchmarks/gemv_bench.py [--layers 32] [--quant int8|fp8] [--sweep]
    python benchmarks/gemv_bench.py --per-linear [--quant int8] [--only down] [--trace] [--tiles '{"PRE": 1}']

The fixed rows: unfused, the Triton GEMV, the CUDA GEMV's FFMA form, and the CUDA GEMV as the
engine runs it by default (the bulk-copy form), each with PDL off and on. --sweep also times
each backend's candidate tiles (`shardline tune-gemm`'s list; --forms picks the forms) and prints
them fastest first; --sweep-gemv-pdl off|on|both sets the CUDA GEMV's own PDL there.

Per layer: RMSNorm -> qkv, o, RMSNorm -> gate/up -> SwiGLU -> down (attention left out: it
reads no weights). Each variant is captured once and replayed; the table gives ms per stack,
the weight bytes streamed per second, and the ratio to the unfused path.

--per-linear times each of the four linears alone (a graph of --layers launches of it, on
distinct weights, the engine's default GEMV with its PDL), beside the same launches with DRY=1
(the consumers skip the product), and for int8 with DP4A=0 (widening and FFMA): µs a launch
and GB/s, so a shape's loss splits into the stream's and the arithmetic's. `ncu` can profile its first, eager, launches.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from shardline.gemm_tuning import agrees
from shardline.kernels import _dispatch, activation, cuda_gemv, gemv, norm, quant


def make_layers(n: int, quantization: str, device: str = "cuda") -> list[dict]:
    H, I, QKV = 4096, 14336, 6144
    layers = []
    for _ in range(n):
        layer = {}
        for name, shape in (("qkv", (QKV, H)), ("o", (H, H)), ("up", (2 * I, H)), ("down", (H, I))):
            w = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02
            layer[name] = quant.WEIGHT_ONLY[quantization][1](w) if quantization in quant.WEIGHT_ONLY else (w, None)
        layer["n1"] = torch.ones(H, device=device, dtype=torch.bfloat16)
        layer["n2"] = torch.ones(H, device=device, dtype=torch.bfloat16)
        layers.append(layer)
    return layers


def unfused(layers: list[dict], h: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    def linear(x, wq):
        w, s = wq
        return quant.quantized_linear(x, w, s) if s is not None else F.linear(x, w)

    for L in layers:
        x, res = norm.rms_norm(h, L["n1"], 1e-5, res)
        qkv = linear(x, L["qkv"])
        attn = linear(qkv[:, :4096].contiguous(), L["o"])  # q stands in for the attention output
        x, res = norm.rms_norm(attn, L["n2"], 1e-5, res)
        h = linear(activation.silu_and_mul(linear(x, L["up"])), L["down"])
    return h


def fused(layers: list[dict], h: torch.Tensor, res: torch.Tensor, c: dict | None, c_glu: dict | None) -> torch.Tensor:
    """The stack as the engine runs it through the GEMV: tiles `c`, and `c_glu` for gate/up."""
    for L in layers:
        qkv, res = gemv.fused_linear(h, *L["qkv"], None, L["n1"], res, 1e-5, config=c)
        attn, _ = gemv.fused_linear(qkv[:, :4096].contiguous(), *L["o"], config=c)
        act, res = gemv.fused_linear(attn, *L["up"], None, L["n2"], res, 1e-5, glu=True, config=c_glu)
        h, _ = gemv.fused_linear(act, *L["down"], config=c)
    return h


LINEARS = {  # name: (weight key, norm key, glu): how the engine calls each linear of a layer
    "qkv": ("qkv", "n1", False), "o": ("o", None, False), "up": ("up", "n2", True), "down": ("down", None, False)}


def per_linear(layers: list[dict], quant: str | None, only: list[str], trace: bool = False,
               tiles: dict | None = None) -> None:
    """µs a launch and weight GB/s of each linear alone, default tiles against DRY=1; with `trace`,
    the block timelines of each linear's last launch (TRACE=1)."""
    H, I = 4096, 14336
    _dispatch.PDL_DISABLED, _dispatch.GEMV_PDL_ENABLED = False, True
    rows, timelines = [], []
    for name in only:
        key, norm_key, glu = LINEARS[name]
        K = I if name == "down" else H
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        res = torch.randn_like(x) if norm_key else None
        nbytes = sum(t.numel() * t.element_size() for L in layers for t in L[key] if t is not None)
        base = {"backend": "cuda", "BULK": 1, **(tiles or {})}
        variants = [("default", base if tiles else {"backend": "cuda"}),
                    ("dry", dict(base, DRY=1))]
        if quant == "int8":  # the int8 product by widening and FFMA, as before dp4a
            variants.insert(1, ("widen", dict(base, DP4A=0)))
        norm_w = (lambda L: L[norm_key]) if norm_key else (lambda L: None)

        def launches(c: dict):  # the linear of every layer, one launch each, on x
            def fn(h, r):
                for L in layers:
                    out, _ = gemv.fused_linear(h, *L[key], None, norm_w(L), r, 1e-5, glu=glu, config=c)
                return out
            return fn
        for label, c in variants:
            ms, _ = time_graph(launches(c), x, res)
            rows.append((name, label, ms * 1e3 / len(layers), nbytes / ms / 1e6))
            print(json.dumps({"linear": name, "variant": label, "quant": quant, "us": round(rows[-1][2], 2),
                              "weight_GBps": round(rows[-1][3], 1)}), flush=True)
        if trace:  # the last launch of a replay, in its place in the stream of launches
            c = dict(base, TRACE=1)
            time_graph(launches(c), x, res)
            L = layers[-1]
            timelines.append((name, cuda_gemv.trace_of(x, *L[key], None, norm_w(L), res, glu, c)))
    print(f"\n{torch.cuda.get_device_name()}: each linear alone, {len(layers)} launches on distinct weights, "
          f"{quant or 'bf16'} weights, batch 1, GEMV PDL on (dry: consumers skip the product; widen: DP4A=0)")
    print(f"{'linear':<6} {'variant':<8} {'us':>8} {'GB/s':>8}")
    for name, label, us, gbps in rows:
        print(f"{name:<6} {label:<8} {us:>8.2f} {gbps:>8.0f}")
    if timelines:
        print_timelines(timelines)


TRACE_PHASES = ("wait for the kernel before", "x and norm", "first stage in", "last stage in",
                "last stage done", "producer done")


def print_timelines(timelines: list[tuple[str, torch.Tensor]]) -> None:
    """Each linear's block timelines (the kernel's TRACE stamps): µs from the block's start to each
    point, median and latest over the blocks, and the spread of the blocks' starts and ends."""
    print("\nblock timelines, us from each block's start: median / latest over the blocks")
    print(f"{'linear':<6} {'starts':>7} {'ends':>6} " + " ".join(f"{p:>16}" for p in TRACE_PHASES))
    for name, t in timelines:
        t = t.double().cpu()
        ghz = ((t[:, 7] - t[:, 1]) / (t[:, 8] - t[:, 0]).clamp(min=1)).median()  # clocks a ns
        us = (t[:, 2:8] - t[:, 1:2]) / ghz / 1e3  # from entry: wait, x, first in, last in, last done, end
        starts, ends = (t[:, 0].max() - t[:, 0].min()) / 1e3, (t[:, 8].max() - t[:, 8].min()) / 1e3
        cols = [f"{us[:, i].median():.2f} / {us[:, i].max():.2f}".rjust(16) for i in range(6)]
        print(f"{name:<6} {starts:>7.2f} {ends:>6.2f} " + " ".join(cols) + f"   ({ghz:.2f} GHz)")


def sweep_configs(backend: str) -> list[tuple[dict, dict]]:
    """(tiles, gate/up tiles) of a backend: `shardline tune-gemm`'s GEMV candidates; the CUDA
    FFMA kernel's gate/up tiles keep half the chunks in flight per row (it streams two rows;
    the MMA form streams the same 16 rows either way)."""
    from shardline.gemm_tuning import GEMV_CONFIGS
    configs = [c for c in GEMV_CONFIGS if c["backend"] == backend]
    if backend == "cuda":
        return [(c, c if c.get("MMA") or c.get("BULK") else dict(c, UNROLL=max(1, c["UNROLL"] // 2)))
                for c in configs]
    return [(c, c) for c in configs]


def time_graph(fn, h: torch.Tensor, res: torch.Tensor, reps: int = 10) -> tuple[float, torch.Tensor]:
    """(ms per replay of fn's graph, fn's output from a run outside the graph)."""
    out = fn(h, res)  # also compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(h, res)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--quant", choices=["int8", "fp8"], help="weight-only quantization")
    ap.add_argument("--sweep", action="store_true", help="time every candidate tile of both backends")
    ap.add_argument("--forms", default="triton,ffma,mma,bulk_ffma,bulk_mma",
                    help="the sweep's kernel forms, comma-separated (CUDA C: ffma, mma, bulk_ffma, bulk_mma)")
    ap.add_argument("--sweep-gemv-pdl", choices=["off", "on", "both"], default="on",
                    help="the CUDA GEMV's own PDL in the sweep (default on)")
    ap.add_argument("--per-linear", action="store_true", help="time each linear alone, and its stream alone")
    ap.add_argument("--only", default="qkv,o,up,down", help="--per-linear's linears, comma-separated")
    ap.add_argument("--trace", action="store_true", help="--per-linear: also the blocks' timelines (TRACE=1)")
    ap.add_argument("--tiles", type=json.loads, help='--per-linear: tiles in place of the default, e.g. \'{"PRE": 1}\'')
    args = ap.parse_args()
    scheme = f"{args.quant}-weight-only" if args.quant else "none"
    layers = make_layers(args.layers, scheme)
    if args.per_linear:
        return per_linear(layers, args.quant, args.only.split(","), args.trace, args.tiles)
    nbytes = sum(t.numel() * t.element_size() for L in layers for k in ("qkv", "o", "up", "down")
                 for t in L[k] if t is not None)
    rows = []
    h = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(h)
    reference = None  # the unfused stack's output: every variant must reproduce it

    def run(name: str, fn, pdl: bool, tiles=None, gemv_pdl: bool = False) -> None:
        """Time fn's stack with the Triton kernels' PDL `pdl` and the CUDA GEMV's `gemv_pdl`."""
        nonlocal reference
        _dispatch.PDL_DISABLED, _dispatch.GEMV_PDL_ENABLED = not pdl, gemv_pdl
        try:
            ms, out = time_graph(fn, h, res)
        except Exception as e:  # a candidate that does not compile or launch is reported, not fatal
            print(f"{name} {tiles}: failed: {type(e).__name__}: {e}", flush=True)
            return
        reference = out if reference is None else reference
        # Rounding differs between the paths and compounds over the layers; a wrong kernel is off by O(1).
        rows.append({"variant": name, "pdl": pdl, "gemv_pdl": gemv_pdl, "quant": args.quant, "layers": args.layers,
                     "ms": round(ms, 4), "weight_GBps": round(nbytes / ms / 1e6, 1), "tiles": tiles,
                     "agrees": agrees(out, reference, tol=0.1)})
        print(json.dumps(rows[-1]), flush=True)

    backends = ["triton"] + (["cuda"] if cuda_gemv.available() else [])
    for pdl in (False, True):
        run("unfused", lambda h, r: unfused(layers, h, r), pdl)
        run("fused triton", lambda h, r: fused(layers, h, r, {"backend": "triton"}, {"backend": "triton"}), pdl)
        if "cuda" in backends:
            ffma, ffma_glu = (dict(c, backend="cuda") for c in (cuda_gemv.FFMA_CONFIG, cuda_gemv.FFMA_GLU_CONFIG))
            run("cuda ffma", lambda h, r: fused(layers, h, r, ffma, ffma_glu), pdl, gemv_pdl=False)
            c = {"backend": "cuda"}  # the engine's default: the bulk form, with its own PDL when pdl is on
            run("cuda default", lambda h, r: fused(layers, h, r, c, c), pdl, gemv_pdl=pdl)
    fixed = len(rows)
    if args.sweep:
        forms = args.forms.split(",")
        pdl_modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.sweep_gemv_pdl]
        for b in backends:
            for c, c_glu in sweep_configs(b):
                form = "triton" if b == "triton" else ("bulk_" if c.get("BULK") else "") + ("mma" if c.get("MMA") else "ffma")
                if form not in forms:
                    continue
                for gemv_pdl in (pdl_modes if b == "cuda" else (False,)):
                    run(f"{b} {form}" if b == "cuda" else b, lambda h, r, c=c, g=c_glu: fused(layers, h, r, c, g),
                        True, [c, c_glu], gemv_pdl)
    _dispatch.PDL_DISABLED, _dispatch.GEMV_PDL_ENABLED = False, None
    base = rows[0]["ms"]
    print(f"\n{torch.cuda.get_device_name()}: {args.layers} layers of decode linears, batch 1, "
          f"{args.quant or 'bf16'} weights ({nbytes / 1e9:.2f} GB)")
    print("PDL: the Triton kernels'; a CUDA GEMV takes it only in the row marked 'GEMV PDL'")
    print(f"{'variant':<14} {'PDL':>4} {'ms':>8} {'GB/s':>8} {'vs unfused':>10}  tiles (WRONG: output differs from unfused)")
    for r in rows[:fixed] + sorted(rows[fixed:], key=lambda r: r["ms"]):
        tiles = "" if r["tiles"] is None else " / ".join(
            ",".join(f"{k}={v}" for k, v in t.items() if k != "backend") for t in r["tiles"])
        print(f"{r['variant']:<14} {'on' if r['pdl'] else 'off':>4} {r['ms']:>8.3f} {r['weight_GBps']:>8.0f} "
              f"{base / r['ms']:>9.2f}x  {tiles}{'  GEMV PDL' if r['gemv_pdl'] else ''}{'' if r['agrees'] else '  WRONG'}")


if __name__ == "__main__":
    main()
