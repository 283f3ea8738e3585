"""What one program of the split-K GEMM (shardline/kernels/triton_quant.py) holds, compiled for sm_90 on any
machine (no GPU): registers a thread and spills, shared memory, and so how many programs a
multiprocessor keeps, for a table's tile.

    python -m benchmarks.splitk_resources [--tile 128,128,1,4,4] [--glu] [--no-tma] [--k 4096]

A tile is BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages as a `tune-gemm` table writes them
(with --glu, BLOCK_N counts the gate and the up rows together, as the table does: the kernel takes
half of each). The shape is Llama-3-8B's gate/up at 64 rows in bf16 with the RMSNorm fold, the
form the batch-64 step runs; without --glu, a plain product (the head's form, no fold).
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.attention_resources import SM_SHARED, resident
from benchmarks.gemv_registers import _ptxas
from shardline.kernels.triton_quant import _int8_linear_kernel


def compile_split_k(block_n: int, block_k: int, split_k: int, warps: int, stages: int, glu: bool = True,
                    tma: bool = True, k: int = 4096, block_m: int = 64):
    """The split-K kernel for sm_90 at one tile (a table's BLOCK_N: with GLU the gate and up rows
    together), bf16, with the RMSNorm fold where GLU, as the engine launches it at 64 rows."""
    fn = _int8_linear_kernel
    order = list(fn.arg_names)
    bn = block_n // 2 if glu else block_n
    ptrs = ("x_ptr", "w_ptr", "scale_ptr", "bias_ptr", "out_ptr", "res_ptr", "store_ptr")
    sig = {n: "*bf16" for n in ptrs}
    sig |= {n: "*fp32" for n in ("part_ptr", "ss_in_ptr", "ss_out_ptr", "centre_ptr", "best_ptr")}
    sig |= {"count_ptr": "*i32", "first_ptr": "*i32", "trace_ptr": "*i64", "eps": "fp32"}
    sig |= {n: "i32" for n in ("M", "N", "K", "stride_xm", "stride_wn", "stride_om", "ss_parts", "stride_res",
                               "greedy_cols")}
    sig |= ({"x_desc": f"tensordesc<bf16[{block_m}, {block_k}]>", "w_desc": f"tensordesc<bf16[{bn}, {block_k}]>"}
            if tma else {"x_desc": "*bf16", "w_desc": "*bf16"})
    constexprs = dict(HAS_SCALE=False, HAS_BIAS=False, FP8=False, EVEN_K=k % block_k == 0, DOT_PRECISION="tf32",
                      GLU=glu, SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=block_k, PREFETCH=1, AHEAD=0,
                      LATE=0, LINE=min(64, block_k), TMA=tma, ROW_NORM=glu, PARTS_P2=32, RESIDUAL=False,
                      ARGMAX=False, GATE_STORE=False, GELU=False, CENTRED=False, SUMS=False, TRACE=False,
                      USE_PDL=True)
    sig |= {c: "constexpr" for c in constexprs}
    aligned = [n for n in order if sig[n].startswith("*") or n.startswith("stride")]
    src = ASTSource(fn=fn, signature={n: sig[n] for n in order},
                    constexprs={(order.index(c),): v for c, v in constexprs.items()},
                    attrs={(order.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def tile(text: str) -> tuple[int, int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 5 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--tile {text!r}: BLOCK_N,BLOCK_K,SPLIT_K,num_warps,num_stages, "
                                         "e.g. 128,128,1,4,4")
    return tuple(int(p) for p in parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tile", type=tile, action="append", help="BLOCK_N,BLOCK_K,SPLIT_K,num_warps,num_stages "
                    "(repeatable; default the batch-64 gate/up entry, 128,128,1,4,4)")
    ap.add_argument("--glu", action="store_true", help="the SwiGLU form with the norm fold (gate/up)")
    ap.add_argument("--no-tma", action="store_true", help="pointer loads rather than tensor descriptors")
    ap.add_argument("--k", type=int, default=4096, help="the reduction length")
    args = ap.parse_args()
    print(f"split-K GEMM, {'SwiGLU with the norm fold' if args.glu else 'plain'}, "
          f"{'pointer loads' if args.no_tma else 'TMA'}, 64 rows, K {args.k}, bf16, sm_90")
    print(f"{'tile':>18} {'regs':>5} {'spill B':>7} {'shared KB':>9} {'programs/SM':>11}")
    for t in args.tile or [(128, 128, 1, 4, 4)]:
        kernel = compile_split_k(*t, glu=args.glu, tma=not args.no_tma, k=args.k)
        regs, spills = _ptxas(kernel.asm["ptx"])
        shared = kernel.metadata.shared
        n = resident(shared, regs, t[3])
        print(f"{','.join(map(str, t)):>18} {regs:>5} {spills:>7} {shared / 1024:>9.1f} {n:>11}")
    print(f"(a multiprocessor: 65,536 registers, {SM_SHARED // 1024} KB of shared memory for programs)")


if __name__ == "__main__":
    main()
