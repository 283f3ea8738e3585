"""What one program of the decode attention kernel holds, compiled for sm_90 on any machine (no
GPU): shared memory, registers a thread and spills, and so how many programs a multiprocessor
keeps resident, for each pipeline depth.

    python -m benchmarks.attention_resources [--stages 1,2,3] [--block-n 64] [--warps 4]

The engine's batch-64 decode step launches 512 programs (64 rows x 8 kv heads) and wants them in
one wave of 132 x 4; and with programmatic dependent launch the o projection's programs, launched
early, need shared memory beside attention's to start streaming their weights. The shapes are
Llama-3-8B's (head_dim 128, 4 query heads a kv head, 16-token blocks, rotary fused, bf16), and the
integer arguments are specialised as a real launch does (divisible by 16), which decides the
vector width of every load.
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.arguments import depths
from benchmarks.gemv_registers import _ptxas
from shardline.kernels._dispatch import next_pow2
from shardline.kernels.triton_attention import _decode_kernel
from shardline.model.random_weights import SHAPES

SM_REGISTERS, SM_SHARED, SM_PROGRAMS = 65536, 227 * 1024, 32  # Hopper, per multiprocessor


# --heads: the model shapes whose decode kernel can compile here (rotary ones).
HEADS = sorted(n for n, c in SHAPES.items() if c["position"] == "rotary")


def compile_decode(stages: int, block_n: int, warps: int, early_kv: bool = False, opaque_bt: bool = False,
                   heads: str = "llama3-8b", rotary: bool = True, maxnreg: int | None = None, late: bool = False,
                   trace: bool = False, new_first: bool = False):
    """The decode kernel as the engine launches it at batch <= 64 (one query row a sequence, no
    context splits), for sm_90; `early_kv`, `opaque_bt`: the config keys EARLY_KV and OPAQUE_BT;
    `heads` a rotary shape of random_weights.SHAPES; `rotary` False: the kernel that
    rotary_decode_attention runs after the rotary kernel (FUSE_ROTARY false); `maxnreg` caps registers a thread (the config key);
    `late`: the LATE key (the next kernel launches once every program has left its loop); `trace`:
    shardline/kernels/trace.py's timeline stores; `new_first`: the NEW_FIRST key (the new token read and
    written before the loop)."""
    shape = SHAPES[heads]
    group, hd, rot = shape["num_heads"] // shape["num_kv_heads"], shape["head_dim"], shape["rotary_dim"]
    fn = _decode_kernel
    order = list(fn.arg_names)
    sig = {n: "*bf16" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "k_new_ptr", "v_new_ptr")}
    sig |= {"cos_sin_ptr": "*fp32", "bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32",
            "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "pos_ptr": "*i64", "slot_ptr": "*i64",
            "scale_log2": "fp32", "v_scale": "fp32", "k_inv_scale": "fp32", "v_inv_scale": "fp32",
            "num_seqs": "i32", "num_heads": "i32", "trace_ptr": "*i64"}
    sig |= {n: "i32" for n in order if n.startswith("stride")}
    constexprs = dict(GROUP=group, GROUP_P2=max(next_pow2(group), 16), HEAD_DIM=hd,
                      HEAD_DIM_P2=max(next_pow2(hd), 16), BLOCK_SIZE=16, BLOCK_N=block_n,
                      NUM_SPLITS=1, SEQS_BLOCK=64, DOT_PRECISION="tf32", ROTARY=rotary, HALF=rot // 2 if rotary else 1,
                      ROT=rot if rotary else 2, ONE_ROW=True,
                      EARLY_KV=early_kv, OPAQUE_BT=opaque_bt, LATE=late, TRACE=trace, USE_PDL=True,
                      NEW_FIRST=new_first and rotary)
    sig |= {k: "constexpr" for k in constexprs}
    aligned = [n for n in order if sig[n].startswith("*") or n.startswith("stride")]
    src = ASTSource(fn=fn, signature={n: sig[n] for n in order},
                    constexprs={(order.index(k),): v for k, v in constexprs.items()},
                    attrs={(order.index(n),): [["tt.divisibility", 16]] for n in aligned})
    options = {"num_warps": warps, "num_stages": stages} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def resident(shared: int, regs: int, warps: int) -> int:
    """Programs a multiprocessor holds at once: the least of what its registers (allocated per
    warp in units of 8 a thread), its shared memory and its block slots allow."""
    per_warp = -(-regs // 8) * 8 * 32
    by_regs = SM_REGISTERS // (per_warp * warps)
    by_shared = SM_SHARED // shared if shared else SM_PROGRAMS
    return min(by_regs, by_shared, SM_PROGRAMS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=depths, default=[1, 2, 3])
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--early-kv", action="store_true", help="the form that reads its first K/V tile before the PDL wait")
    ap.add_argument("--opaque-bt", action="store_true",
                    help="the form that reads block ids by inline PTX, so that the K/V tiles pipeline (OPAQUE_BT)")
    ap.add_argument("--new-first", action="store_true",
                    help="the form that reads and writes the new token before the loop (NEW_FIRST)")
    ap.add_argument("--heads", choices=HEADS, default="llama3-8b", help="the model's head shape")
    ap.add_argument("--no-rotary", action="store_true", help="the kernel without rotary fused (FUSE_ROTARY false)")
    ap.add_argument("--maxnreg", type=int, help="cap registers a thread (the decode config's maxnreg)")
    args = ap.parse_args()
    if args.maxnreg is not None and not 24 <= args.maxnreg <= 255:
        ap.error(f"--maxnreg {args.maxnreg}: registers a thread, from 24 to 255")
    if min(args.stages) < 1 or args.block_n < 16 or args.block_n & (args.block_n - 1) or args.warps not in (1, 2, 4, 8):
        ap.error(f"--stages {args.stages}, --block-n {args.block_n}, --warps {args.warps}: stages >= 1, BLOCK_N a "
                 "power of two >= 16 (the kernel's dot), warps one of 1, 2, 4, 8")
    print(f"decode attention, {args.heads} heads, BLOCK_N {args.block_n}, {args.warps} warps, sm_90"
          + (", rotary in its own kernel" if args.no_rotary else ", rotary fused")
          + (f", at most {args.maxnreg} registers" if args.maxnreg else "")
          + (", first K/V tile before the PDL wait" if args.early_kv else "")
          + (", block ids by inline PTX" if args.opaque_bt else "")
          + (", the new token before the loop" if args.new_first else ""))
    print(f"{'stages':>6} {'shared KB':>9} {'regs':>5} {'spill B':>7} {'programs/SM':>11} {'shared left KB':>14}")
    for stages in args.stages:
        kernel = compile_decode(stages, args.block_n, args.warps, args.early_kv, args.opaque_bt, args.heads,
                                not args.no_rotary, args.maxnreg, new_first=args.new_first)
        regs, spills = _ptxas(kernel.asm["ptx"])
        shared = kernel.metadata.shared
        n = resident(shared, regs, args.warps)
        print(f"{stages:>6} {shared / 1024:>9.1f} {regs:>5} {spills:>7} {n:>11} {(SM_SHARED - n * shared) / 1024:>14.1f}")


if __name__ == "__main__":
    main()
