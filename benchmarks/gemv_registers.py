"""Registers and spills of the decode GEMVs' variants, compiled for sm_90 on any machine (no GPU):
Triton lowers its kernel to PTX, NVRTC the CUDA C one, and Triton's bundled `ptxas -v` reports
what each thread holds.

    pip install triton nvidia-cuda-nvrtc-cu12   # CPU machines: the triton wheel carries ptxas
    python benchmarks/gemv_registers.py [--cuda]

A tile with more than ~128 registers a thread halves the programs resident per multiprocessor,
and a spill puts the accumulator in local memory; both cost a weight stream its bandwidth. The
tile lists in `shardline/kernels/triton_gemv.py` and `shardline/gemm_tuning.py` keep to tiles this shows
clean.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from shardline.kernels.triton_gemv import _gemv_kernel

VARIANTS = {"bf16": dict(INT8=False, NORM=False, GLU=False), "bf16+norm": dict(INT8=False, NORM=True, GLU=False),
            "bf16+norm+glu": dict(INT8=False, NORM=True, GLU=True), "int8": dict(INT8=True, NORM=False, GLU=False),
            "int8+norm+glu": dict(INT8=True, NORM=True, GLU=True)}


def _ptxas(ptx: str) -> tuple[int, int]:
    """(registers per thread, spill-store bytes) of the one kernel in `ptx`, for sm_90a."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        log = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Used (\d+) registers", log).group(1)), int(re.search(r"(\d+) bytes spill stores", log).group(1))


def cuda_usage(tiles: dict, w_bytes: int, fp8: bool, norm: bool, glu: bool) -> tuple[int, int]:
    from shardline.kernels import cuda_gemv
    ptx = cuda_gemv.compile_ptx(cuda_gemv.defines(x_fp16=False, w_bytes=w_bytes, fp8=fp8, norm=norm, res=norm,
                                                  glu=glu, scale=w_bytes == 1, bias=False, pdl=False, **tiles))
    # NVRTC may be newer than Triton's ptxas; the instructions this kernel uses are older than both.
    return _ptxas(re.sub(r"^\.version \d+\.\d+", ".version 8.0", ptx, count=1, flags=re.M))


CUDA_VARIANTS = {"bf16": dict(w_bytes=2, fp8=False, norm=False, glu=False),
                 "bf16+norm": dict(w_bytes=2, fp8=False, norm=True, glu=False),
                 "bf16+norm+glu": dict(w_bytes=2, fp8=False, norm=True, glu=True),
                 "int8": dict(w_bytes=1, fp8=False, norm=False, glu=False),
                 "int8+norm+glu": dict(w_bytes=1, fp8=False, norm=True, glu=True),
                 "fp8+norm+glu": dict(w_bytes=1, fp8=True, norm=True, glu=True)}


def main_cuda() -> None:
    """The CUDA C GEMV at `shardline tune-gemm`'s tiles (FFMA gate/up variants at half the chunks,
    as benchmarks/gemv_bench.py runs them; bulk tiles worked out for K = 4096)."""
    from shardline.gemm_tuning import GEMV_CONFIGS
    from shardline.kernels import cuda_gemv
    print(f"{'form':>8} {'tiles':<40}  " + "  ".join(f"{v:>14}" for v in CUDA_VARIANTS))
    for cfg in (c for c in GEMV_CONFIGS if c["backend"] == "cuda"):
        tiles = {k: v for k, v in cfg.items() if k != "backend"}
        cells = []
        for flags in CUDA_VARIANTS.values():
            t = cuda_gemv.resolve_tiles(cfg, 4096, flags["w_bytes"], flags["glu"])
            if flags["glu"] and not (tiles.get("MMA") or tiles.get("BULK")):
                t = dict(t, UNROLL=max(1, t["UNROLL"] // 2))
            regs, spill = cuda_usage(t, **flags)
            cells.append(f"{regs}" + (f" spill {spill}B" if spill else ""))
        form = ("bulk_" if tiles.get("BULK") else "") + ("mma" if tiles.get("MMA") else "ffma")
        shown = ",".join(f"{k}={v}" for k, v in tiles.items() if k not in ("BULK", "MMA"))
        print(f"{form:>8} {shown:<40}  " + "  ".join(f"{c:>14}" for c in cells), flush=True)


def ptxas_usage(block_n: int, block_k: int, num_warps: int, INT8: bool, NORM: bool, GLU: bool) -> tuple[int, int]:
    """(registers per thread, spill-store bytes) of one variant."""
    sig = {name: "*bf16" for name in ("x_ptr", "res_ptr", "norm_ptr", "res_out_ptr", "scale_ptr", "bias_ptr", "out_ptr")}
    sig |= {"w_ptr": "*i8" if INT8 else "*bf16", "N": "i32", "K": "i32", "eps": "fp32", "stride_w": "i32"}
    constexprs = dict(NORM=NORM, HAS_RES=NORM, HAS_SCALE=INT8, HAS_BIAS=False, GLU=GLU, INT8=INT8, FP8=False, USE_PDL=True,
                      BLOCK_N=block_n, BLOCK_K=block_k)
    sig |= {k: "constexpr" for k in constexprs}
    order = list(_gemv_kernel.arg_names)
    attrs = {(order.index(n),): [["tt.divisibility", 16]] for n in sig if sig[n] != "constexpr" and n != "eps"}
    src = ASTSource(fn=_gemv_kernel, signature={n: sig[n] for n in order}, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1})
    return _ptxas(kernel.asm["ptx"])


def main() -> None:
    print(f"{'BLOCK_N':>7} {'BLOCK_K':>7} {'warps':>5} {'w/thread':>8}  " + "  ".join(f"{v:>14}" for v in VARIANTS))
    for bn, bk, w in itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8)):
        per_thread = bn * bk // (32 * w)
        if not 16 <= per_thread <= 64:
            continue
        cells = []
        for flags in VARIANTS.values():
            regs, spill = ptxas_usage(bn, bk, w, **flags)
            cells.append(f"{regs}" + (f" spill {spill}B" if spill else ""))
        print(f"{bn:>7} {bk:>7} {w:>5} {per_thread:>8}  " + "  ".join(f"{c:>14}" for c in cells), flush=True)


if __name__ == "__main__":
    import sys
    main_cuda() if "--cuda" in sys.argv[1:] else main()
