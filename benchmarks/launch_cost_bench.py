"""What a batch-64 product costs besides its bytes: time against weight size, fitted to a line.

    python -m benchmarks.launch_cost_bench [--gemm-config benchmarks/results/gemm-h200-decode.json]
        [--ahead 4,6,8]

For K = 4096 (the gate/up, qkv, o and head products) and K = 14336 (down), each implementation
multiplies 64 rows by weights of growing N, every launch on its own copy (>= 512 MB in a graph,
so L2 holds none of it). A least-squares line t = fixed + bytes / rate splits each launch into
the rate its loop streams at and a fixed cost per launch: the ramp before the first bytes arrive,
the tail after the last, the epilogue. Implementations: cuBLAS, and the split-K kernel at the
table's tile for that K (with --gemm-config; otherwise its gate/up and down tiles of the H200
table). Launches here are back to back in one graph, so PDL (on by default on Hopper) overlaps
each split-K launch with the one before it as the engine's step does; cuBLAS's do not overlap.

On Hopper with Gluon it also times the ring GEMM (shardline/kernels/gluon_ring.py: a producer warp streams
the weights, its first stages before the PDL wait), and the same with EARLY=0 (nothing before the
wait): the difference is what requesting weights early does to the fixed cost. --ahead adds the split-K kernel with its in-loop L2 prefetch at each distance (AHEAD, tiles). Each
split-K point also reports its programs and the rate a busy multiprocessor streams at (bytes /
time / min(programs, multiprocessors), one program a multiprocessor at these tiles): if that rate
holds when fewer multiprocessors are busy, a program's stream is bound by its bytes in flight,
not by the memory, and a partial last wave costs its idle multiprocessors' share.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.arguments import depths
from shardline.gemm_tuning import GemmTable, _time_graph_us
from shardline.kernels import quant
from shardline.kernels._dispatch import sm_count

# The H200 table's split-K tiles (gemm-h200-decode.json, 2026-11-30): gate/up and the head at
# K = 4096, down at K = 14336.
TILES = {4096: dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, TMA=1),
         14336: dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5, TMA=1)}
SIZES = {4096: (4096, 7168, 14336, 28672, 57344), 14336: (1024, 2048, 4096, 8192, 16384)}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares t = a + b * bytes over (bytes, us): (a in us, rate in GB/s)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, 1e-3 / b


def programs(c: dict, n: int, batch: int, ring: bool = False) -> int:
    """Programs of a split-K (or, `ring`, ring GEMM) launch of config c on n weight rows: output
    tiles times K splits; the ring GEMM's x tile is always 64 rows."""
    block_m = 64 if ring or batch > 16 else 16
    return -(-n // c["BLOCK_N"]) * -(-batch // c.get("BLOCK_M", block_m)) * c.get("SPLIT_K", 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemm-config", help="take the split-K tiles from this table (its M = 64 entries)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ahead", type=depths, default=[], help="also the split-K kernel with AHEAD=each (e.g. 4,6,8)")
    args = ap.parse_args()
    tiles = dict(TILES)
    if args.gemm_config:
        table = GemmTable.load(args.gemm_config, torch.device("cuda"))
        if table is None:
            ap.error(f"--gemm-config {args.gemm_config}: missing, or tuned on another GPU than "
                     f"{torch.cuda.get_device_name()} (run `shardline tune-gemm`)")
        for k, n in ((4096, 28672), (14336, 4096)):
            c = table.choice(n, k, torch.bfloat16, torch.bfloat16, args.batch)
            if c and c["impl"] == "triton":
                tiles[k] = c["config"]
    torch.manual_seed(0)
    results = []
    for k, sizes in SIZES.items():
        x = torch.randn(args.batch, k, device="cuda", dtype=torch.bfloat16)
        configs = {"split-K": tiles[k]} | {f"split-K ahead={d}": dict(tiles[k], AHEAD=d) for d in args.ahead}
        impls = {"cublas": lambda x, w: torch.nn.functional.linear(x, w)}
        impls |= {name: lambda x, w, c=c: quant.small_m_linear(x, w, None, None, c) for name, c in configs.items()}
        if quant.ring_available(x):
            ring = {"ring": quant.ring_config(None), "ring, EARLY=0": quant.ring_config({"EARLY": 0})}
            impls |= {name: lambda x, w, c=c: quant.ring_linear(x, w, None, c) for name, c in ring.items()}
            configs |= ring
        points: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
        for n in sizes:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            nbytes = w.numel() * 2
            copies = max(2, -(-(512 << 20) // nbytes))
            ws = [w] + [w.clone() for _ in range(copies - 1)]
            for name, f in impls.items():
                try:
                    us = _time_graph_us(lambda i, f=f: f(x, ws[i]), copies)
                except Exception as e:  # noqa: BLE001 - one implementation failing leaves the others' numbers
                    print(json.dumps({"K": k, "N": n, "impl": name, "failed": f"{type(e).__name__}: {e}"[:300]}))
                    continue
                points[name].append((nbytes, us))
                row = {"K": k, "N": n, "impl": name, "MB": round(nbytes / 1e6, 1), "us": round(us, 2),
                       "GBps": round(nbytes / us / 1e3, 1)}
                if name in configs:
                    p = programs(configs[name], n, args.batch, ring=name.startswith("ring"))
                    row |= {"programs": p, "GBps_per_busy_sm": round(nbytes / us / 1e3 / min(p, sm_count(x)), 2)}
                print(json.dumps(row), flush=True)
            del ws, w
            torch.cuda.empty_cache()
        for name, pts in points.items():
            if len(pts) < 2:
                continue
            fixed, rate = fit(pts)
            results.append({"K": k, "impl": name, "fixed_us": round(fixed, 2), "rate_GBps": round(rate, 1),
                            "tiles": configs.get(name)})
            print(json.dumps(results[-1]), flush=True)
    print(f"\n{torch.cuda.get_device_name()}: batch {args.batch}, t = fixed + bytes / rate over N in {SIZES}")
    for r in results:
        print(f"K={r['K']:<6} {r['impl']:<16} fixed {r['fixed_us']:6.2f} us   rate {r['rate_GBps']:7.0f} GB/s")


if __name__ == "__main__":
    main()
