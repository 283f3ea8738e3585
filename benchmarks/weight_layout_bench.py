"""Does the weights' layout in memory cap the batch-64 GEMMs' bandwidth? A probe, not an engine path.

    python -m benchmarks.weight_layout_bench [--x-once]

At batch 64 the split-K kernel streams gate/up at ~3.9 TB/s, where the batch-1 GEMV, which reads
whole runs of rows, reaches ~4.4. One difference: a [BLOCK_N, BLOCK_K] tile of a row-major
[N, K] weight is BLOCK_N pieces of BLOCK_K * 2 bytes (256 B at BLOCK_K = 128), each in another
DRAM page, while the GEMV's copies are contiguous. This times one minimal TMA kernel (the
split-K kernel's loop without its epilogue: partial sums out) on the weight as it is and on the
same weight packed tile by tile ([N / BLOCK_N, K / BLOCK_K, BLOCK_N, BLOCK_K], each tile 32 KB
contiguous), beside cuBLAS and the split-K kernel as the tuned table runs it. Both layouts give
the same products (checked). If the packed layout streams faster, the loader could pack the
weights the table gives to the split-K kernel; cuBLAS (prefill) and the GEMV read row-major, so
that is not free. --x-once also times the probe reusing one x tile, to see what the x tiles' L2
reads (64 rows x K, again for every tile of rows) cost the weight stream.
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

from shardline.gemm_tuning import _time_graph_us, agrees
from shardline.kernels import quant


@triton.jit
def _probe_kernel(x_desc, w_desc, part_ptr, M, N, KT, KT_PER_SPLIT, PACKED: tl.constexpr, X_ONCE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """part[pid_k, :M, tile] = x[:, split's K] @ w[tile, split's K].T; w row-major [N, K] or, with
    PACKED, [N / BLOCK_N * KT * BLOCK_N, BLOCK_K] holding tile (n, kb) at rows (n * KT + kb) * BLOCK_N.
    X_ONCE: every iteration multiplies the split's first x tile (a wrong product): the weight
    stream without the [BLOCK_M, BLOCK_K] x tile each iteration reads from L2."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    x = x_desc.load([0, pid_k * KT_PER_SPLIT * BLOCK_K])
    for i in range(0, KT_PER_SPLIT):
        kb = pid_k * KT_PER_SPLIT + i
        if not X_ONCE:
            x = x_desc.load([0, kb * BLOCK_K])
        if PACKED:
            w = w_desc.load([(pid_n * KT + kb) * BLOCK_N, 0])
        else:
            w = w_desc.load([pid_n * BLOCK_N, kb * BLOCK_K])
        acc = tl.dot(x, tl.trans(w), acc)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(part_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=offs_m[:, None] < M)


def pack(w: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    n, k = w.shape
    return w.view(n // block_n, block_n, k // block_k, block_k).permute(0, 2, 1, 3).contiguous().view(-1, block_k)


def probe(x: torch.Tensor, w: torch.Tensor, k: int, packed: bool, cfg: dict, x_once: bool = False) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    m = x.shape[0]
    n = w.numel() // k
    part = torch.empty(split, m, n, device=x.device, dtype=torch.float32)
    kt = k // bk
    _probe_kernel[(n // bn, split)](TensorDescriptor.from_tensor(x, [64, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                                    part, m, n, kt, kt // split, PACKED=packed, X_ONCE=x_once, BLOCK_M=64, BLOCK_N=bn, BLOCK_K=bk,
                                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return part.sum(0)


SHAPES = {"gate/up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096)}
TILES = [dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=5),
         dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4),
         dict(BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, num_warps=4, num_stages=6),
         dict(BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3)]


# The H200 table's tiles (gemm-h200-decode.json) for each shape; qkv runs cuBLAS there, this is its best split-K tile.
TABLE_TILES = {"gate/up": TILES[0], "down": TILES[1], "qkv": TILES[2]}


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--x-once", action="store_true",
                    help="only the table's tile per shape, and also the probe that reuses one x tile (the weight "
                         "stream without x's L2 reads; its product is wrong by design)")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(1, -(-(512 << 20) // (w.numel() * 2)))  # >= 512 MB of weights: L2 holds none of it
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x, w).float()
        gb = w.numel() * 2 / 1e3  # bytes / 1e3: GB/s from us

        def report(variant, us, ok=True, tiles=None):
            rows.append({"shape": name, "variant": variant, "us": round(us, 2), "GBps": round(gb / us, 1),
                         "tiles": tiles, "agrees": ok})
            print(json.dumps(rows[-1]), flush=True)

        report("cublas", _time_graph_us(lambda i: torch.nn.functional.linear(x, ws[i]), copies))
        for cfg in [TABLE_TILES[name]] if args.x_once else TILES:
            if n % cfg["BLOCK_N"] or k % (cfg["BLOCK_K"] * cfg["SPLIT_K"]):
                continue
            prod = dict(cfg, TMA=1)
            report("split-K kernel (TMA)", _time_graph_us(lambda i: quant.small_m_linear(x, ws[i], None, None, prod), copies),
                   agrees(quant.small_m_linear(x, w, None, None, prod).float(), ref), cfg)
            report("probe, row-major", _time_graph_us(lambda i: probe(x, ws[i], k, False, cfg), copies),
                   agrees(probe(x, w, k, False, cfg), ref), cfg)
            packed = [pack(t, cfg["BLOCK_N"], cfg["BLOCK_K"]) for t in ws]
            report("probe, tile-packed", _time_graph_us(lambda i: probe(x, packed[i], k, True, cfg), copies),
                   agrees(probe(x, packed[0], k, True, cfg), ref), cfg)
            if args.x_once:
                report("probe, one x tile (wrong product)",
                       _time_graph_us(lambda i: probe(x, ws[i], k, False, cfg, x_once=True), copies), None, cfg)
                report("probe, packed, one x tile",
                       _time_graph_us(lambda i: probe(x, packed[i], k, True, cfg, x_once=True), copies), None, cfg)
            del packed
        del ws
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}: batch 64, bf16 weights, us a launch (GB/s of weights)")
    for r in rows:
        tiles = "" if r["tiles"] is None else ",".join(f"{k}={v}" for k, v in r["tiles"].items())
        print(f"{r['shape']:<8} {r['variant']:<22} {r['us']:>8.2f} {r['GBps']:>7.0f}  {tiles}{'  WRONG' if r['agrees'] is False else ''}")


if __name__ == "__main__":
    main()
