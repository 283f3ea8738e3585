"""What one program of the ring GEMM (shardline/kernels/gluon_ring.py) holds, compiled for sm_90 on any
machine (no GPU): registers a thread at launch, spills, shared memory, and so how many programs a
multiprocessor keeps, for a tile and a launch register cap (`maxnreg`).

    python -m benchmarks.ring_resources [--tile 64,128,4,1] [--maxnreg 0,128] [--glu] [--fold res|norm|none]

The ring is warp-specialized: it launches with `.maxnreg` registers a thread for its 256 threads
and then moves registers between its consumer warpgroup and its producer warp (`setmaxnreg`).
Uncapped it asks for 256 a thread, the whole register file, so no other kernel's program fits
beside it; a cap of 128 leaves half. Tiled form only (BLOCK_N rows a program), Llama-3-8B's bf16.
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget

from benchmarks.attention_resources import SM_SHARED, resident
from benchmarks.gemv_registers import _ptxas


def compile_ring(block_n: int, block_k: int, stages: int, split_k: int, glu: bool, fold: str, maxnreg: int = 0,
                 late: bool = False, trace: bool = False):
    """The ring kernel as ring_linear_gluon launches it for a tiled config at 64 rows, for sm_90
    (`late`: the LATE key; `trace`: shardline/kernels/trace.py's timeline stores)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from shardline.kernels.gluon_ring import _ring_linear_kernel
    fn = _ring_linear_kernel
    order = list(fn.arg_names)
    x_layout = gl.NVMMASharedLayout.get_default_for([64, block_k], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    sig = {"x_desc": f"tensordesc<bf16[64, {block_k}],{x_layout!r}>",
           "w_desc": f"tensordesc<bf16[{block_n}, {block_k}],{w_layout!r}>",
           "count_ptr": "*i32", "eps": "fp32", "trace_ptr": "*i64"}
    sig |= {n: "*bf16" for n in ("bias_ptr", "out_ptr", "res_ptr")}
    sig |= {n: "*fp32" for n in ("part_ptr", "ss_in_ptr", "ss_out_ptr", "centre_ptr")}
    sig |= {n: "i32" for n in ("M", "N", "K", "stride_om", "total_runs", "programs", "oob_row", "ss_parts", "stride_res")}
    constexprs = dict(BLOCK_N=block_n, HAS_BIAS=False, GLU=glu, SPLIT_K=split_k, STAGES=stages, EARLY=stages,
                      ROW_NORM=fold == "norm", PARTS_P2=32, RESIDUAL=fold == "res", CENTRED=False,
                      SUMS=False, USE_PDL=True, LATE=late,
                      TRACE=trace, num_warps=4)
    sig |= {k: "constexpr" for k in constexprs}
    src = GluonASTSource(fn=fn, signature={n: sig[n] for n in order},
                         constexprs={(order.index(k),): v for k, v in constexprs.items()})
    options = {"num_warps": 4} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tile", default="64,128,4,1", help="BLOCK_N,BLOCK_K,STAGES,SPLIT_K")
    ap.add_argument("--maxnreg", default="0,128", help="launch register caps, comma-separated (0: none)")
    ap.add_argument("--glu", action="store_true", help="the SwiGLU form (gate and up tiles)")
    ap.add_argument("--fold", default="none", choices=["none", "norm", "res"],
                    help="the fold's epilogue: rows scaled by 1/rms (norm) or the residual add (res)")
    args = ap.parse_args()
    try:
        block_n, block_k, stages, split_k = (int(v) for v in args.tile.split(","))
        caps = [int(v) for v in args.maxnreg.split(",")]
    except ValueError:
        ap.error(f"--tile {args.tile!r} / --maxnreg {args.maxnreg!r}: four integers BLOCK_N,BLOCK_K,STAGES,SPLIT_K "
                 "and integer caps, e.g. --tile 64,128,4,1 --maxnreg 0,128")
    if min(block_n, block_k, stages, split_k) < 1 or any(c < 0 or c > 255 for c in caps):
        ap.error(f"--tile {args.tile}, --maxnreg {args.maxnreg}: positive tile values, caps 0-255")
    print(f"ring GEMM, BLOCK_N {block_n}, BLOCK_K {block_k}, {stages} stages, K split {split_k}"
          f"{', SwiGLU' if args.glu else ''}, fold {args.fold}, 64 rows, sm_90")
    print(f"{'maxnreg':>7} {'regs':>5} {'spill B':>7} {'threads':>7} {'regs/program':>12} {'shared KB':>9} "
          f"{'programs/SM':>11}")
    for cap in caps:
        kernel = compile_ring(block_n, block_k, stages, split_k, args.glu, args.fold, cap)
        regs, spills = _ptxas(kernel.asm["ptx"])
        warps, shared = kernel.metadata.num_warps, kernel.metadata.shared
        print(f"{cap or '-':>7} {regs:>5} {spills:>7} {32 * warps:>7} {regs * 32 * warps:>12} {shared / 1024:>9.1f} "
              f"{resident(shared, regs, warps):>11}")
    print(f"(a multiprocessor: 65,536 registers, {SM_SHARED // 1024} KB of shared memory for programs)")


if __name__ == "__main__":
    main()
