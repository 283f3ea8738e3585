"""Stream-K GEMM for decode at batch 2..64: y = x @ W.T [* scale] [+ bias] [-> silu(gate) * up].

At batch 64 a decode step still reads every weight once and the matrix units idle most of the
time, so a linear is a weight stream again, only with [BLOCK_M, BLOCK_K] of x riding along each
[BLOCK_N, BLOCK_K] weight tile (from L2: x is 64 rows). What cost bandwidth in the tiled kernel
(triton_quant.py) and in cuBLAS is the shape of the grid, not the loop:

- waves: 48 output tiles of the [6144, 4096] qkv projection, split-K 2, is 96 programs; on 132
  multiprocessors that is one wave three quarters full, then nothing;
- ramps: each program fills its pipeline from DRAM before its first product, and the next kernel
  waits for the last program of this one.

So this kernel is persistent and its work is cut by iterations, not tiles: the (tile, k-tile)
iterations, tile-major, are dealt out in P equal contiguous ranges, one per program (P is the
number of multiprocessors times the programs each holds). A program's range covers the tail of
one tile, whole tiles, and the head of another; the head and tail are partial sums. Each partial
goes to a workspace slot and bumps its tile's counter; the last of the tile's programs to arrive
sums the slots in program order (deterministic) and runs the epilogue once its own range is
done, then zeroes the counter for the next call. (Every thread counts its own partial stores in
with a release; a barrier and one count per program would serialise Triton's software pipeline.)
One launch, no host synchronisation: CUDA-graph safe (warm up before capture).

Programmatic dependent launch (Hopper): the weights depend on no earlier kernel, so each program
asks L2 for its first PREFETCH weight tiles before it waits for the kernel before it; its
pipeline then fills from L2 while the other multiprocessors still drain.

GLU: W is the fused [gate; up] projection [2I, K]; each tile holds BLOCK_N gate rows and the
BLOCK_N up rows I below them, and the epilogue writes silu(gate) * up [M, I], rounding where the
unfused path (the product, then activation.silu_and_mul) rounds.

Measured on the H200 (docs/benchmarks.md, 2026-11-30), it does not pay: each launch loses 4-6 us
to cuBLAS (batch-64 stack 4.66-4.84 ms against 4.17; batch 16 2.08 against 1.95), by our
estimate to its ramp and to summing partials after the loop rather than to the loop itself. `shardline tune-gemm` times it among its
candidates at 2-64 rows, so a GPU where it wins gets it; on the H200 it is chosen nowhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_args, sm_count
from .quant import STREAMK_MAX_M as MAX_M
from .triton_pdl import pdl_wait
from .triton_quant import _tile_counters, epilogue, load_tiles, multiply_tiles, prefetch_tile, tensor_descriptors


@triton.jit
def _program_start(p, total, P):
    """First iteration of program p: ranges are [p*total // P, (p+1)*total // P)."""
    return p * total // P


@triton.jit
def _owner(it, total, P):
    """The program whose range holds iteration `it`: the largest p with p*total // P <= it."""
    return ((it + 1) * P - 1) // total


@triton.jit
def _streamk_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, part_ptr, count_ptr, M, N, K,
                    stride_xm, stride_wn, stride_om,
                    HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, FP8: tl.constexpr, GLU: tl.constexpr,
                    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    LINE: tl.constexpr, THREADS: tl.constexpr, TMA: tl.constexpr, USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = tl.cdiv(N, BLOCK_N) * k_tiles
    lo = _program_start(pid, total, P)
    hi = _program_start(pid + 1, total, P)
    offs_m = tl.arange(0, BLOCK_M)
    offs_bn = tl.arange(0, BLOCK_N)
    offs_bk = tl.arange(0, BLOCK_K)
    up_rows = N * stride_wn  # GLU: the up rows sit N rows below the gate rows

    if USE_PDL & (PREFETCH > 0) & (not TMA):  # the weights depend on no earlier kernel: towards L2
        for i in tl.static_range(PREFETCH):
            it = tl.minimum(lo + i, hi - 1)
            tile = it // k_tiles
            rows = tl.minimum(tile * BLOCK_N + offs_bn, N - 1).to(tl.int64) * stride_wn
            prefetch_tile(w_ptr, rows, (it - tile * k_tiles) * BLOCK_K, K, up_rows, BLOCK_K, LINE, GLU)
    pdl_wait(USE_PDL)

    m_mask = offs_m[:, None] < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    PART: tl.constexpr = (2 if GLU else 1) * BLOCK_M * BLOCK_N  # one slot of the workspace
    part_tile = offs_m[:, None] * BLOCK_N + offs_bn[None, :]
    reduce_first = -1  # the tile (if any) this program sums: at its first segment ...
    reduce_last = -1  # ... and at its last
    for it in range(lo, hi):
        tile = it // k_tiles
        kb = it - tile * k_tiles
        offs_n = tile * BLOCK_N + offs_bn
        offs_k = kb * BLOCK_K + offs_bk
        if TMA:  # x_ptr and w_ptr are tensor descriptors: the copy engine fetches, zero-filling the edges
            x = x_ptr.load([0, kb * BLOCK_K])
            w = w_ptr.load([tile * BLOCK_N, kb * BLOCK_K])
            u = w
            if GLU:
                u = w_ptr.load([N + tile * BLOCK_N, kb * BLOCK_K])
        else:
            x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
            w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
            x, w, u = load_tiles(x_ptrs, w_ptrs, up_rows, m_mask, offs_n[:, None] < N, offs_k[None, :] < K,
                                 EVEN_K, GLU)
        acc, acc_up = multiply_tiles(x, w, u, acc, acc_up, FP8, GLU, DOT_PRECISION)

        if (kb == k_tiles - 1) | (it == hi - 1):  # this program's share of the tile is done
            tile_lo = tile * k_tiles
            first = _owner(tile_lo, total, P)
            last = _owner(tile_lo + k_tiles - 1, total, P)
            if first == last:  # the whole tile: no partials
                epilogue(acc, acc_up, scale_ptr, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om,
                         HAS_SCALE, HAS_BIAS, GLU)
            else:
                # Slot 2p holds program p's first segment, 2p + 1 its last (when they differ).
                slot = 2 * pid + (lo < tile_lo).to(tl.int32)
                tl.store(part_ptr + slot * PART + part_tile, acc)
                if GLU:
                    tl.store(part_ptr + slot * PART + BLOCK_M * BLOCK_N + part_tile, acc_up)
                # Every thread counts its own stores in (a barrier here would keep Triton from
                # pipelining the loop): the tile is complete at contributors x threads arrivals.
                arrived = tl.atomic_add(count_ptr + tile + tl.zeros([THREADS], tl.int32), 1, sem="acq_rel",
                                        scope="gpu")
                if tl.max((arrived == (last - first + 1) * THREADS - 1).to(tl.int32), 0) > 0:
                    if lo < tile_lo:  # the tile's last arrival sums it, after its loop
                        reduce_last = tile
                    else:
                        reduce_first = tile
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)

    # The sums are outside the loop: a loop nested in it would keep Triton from pipelining it.
    for r in tl.static_range(2):
        tile = reduce_first if r == 0 else reduce_last
        if tile >= 0:
            tile_lo = tile * k_tiles
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for p in range(_owner(tile_lo, total, P), _owner(tile_lo + k_tiles - 1, total, P) + 1):
                s = 2 * p + (_program_start(p, total, P) < tile_lo).to(tl.int32)
                acc += tl.load(part_ptr + s * PART + part_tile, cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(part_ptr + s * PART + BLOCK_M * BLOCK_N + part_tile, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)
            epilogue(acc, acc_up, scale_ptr, bias_ptr, out_ptr, offs_m, tile * BLOCK_N + offs_bn, M, N,
                     stride_om, HAS_SCALE, HAS_BIAS, GLU)


def default_config(M: int, glu: bool) -> dict:
    """Tiles of 32 KB of bf16 weights (16 KB of int8) per iteration, with 16 KB of x (BLOCK_M=64);
    four stages in flight, one program per multiprocessor: the best of the batch-64 sweep
    (`benchmarks/skinny_bench.py --sweep`) but for TMA loads (a candidate of tune-gemm's)."""
    block_m = 16 if M <= 16 else (32 if M <= 32 else 64)
    return dict(BLOCK_M=block_m, BLOCK_N=64 if glu else 128, BLOCK_K=128, num_warps=8 if block_m == 64 else 4,
                num_stages=4, PROGRAMS_PER_SM=1, PREFETCH=4)


def streamk_linear_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None, glu: bool = False,
                          config: dict | None = None) -> torch.Tensor:
    """y [.., N] (or [.., N/2] with `glu`) for x [.., K] and w [N, K]: x's dtype, or int8 / fp8
    with a per-row `scale` [N]."""
    N2, K = w.shape
    N = N2 // 2 if glu else N2
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    assert M <= MAX_M and N2 == (2 * N if glu else N), "checked by quant.streamk_linear"
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    assert w.stride(-1) == 1, "weight rows must be contiguous"
    cfg = dict(config or default_config(M, glu))
    block_m = max(cfg.pop("BLOCK_M", 64), 16)
    cfg.setdefault("PREFETCH", 4)
    per_sm = cfg.pop("PROGRAMS_PER_SM", 1)
    programs = cfg.pop("PROGRAMS", None)  # a fixed count (tests: uneven ranges on a small problem)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out.view(*x.shape[:-1], N)
    tiles = triton.cdiv(N, cfg["BLOCK_N"])
    total = tiles * triton.cdiv(K, cfg["BLOCK_K"])
    programs = min(programs or per_sm * sm_count(x), total)  # each program at least one iteration
    part = torch.empty((2 * programs, 2 if glu else 1, block_m, cfg["BLOCK_N"]), dtype=torch.float32, device=x.device)
    counters = _tile_counters(x.device, tiles)
    dummy = scale if scale is not None else out
    fp8 = w.dtype == torch.float8_e4m3fn
    w_arg = w.view(torch.uint8) if fp8 else w
    x_arg, w_arg = tensor_descriptors(x2, w_arg, block_m, cfg) if cfg.pop("TMA", 0) else (x2, w_arg)
    tma = x_arg is not x2
    _streamk_kernel[(programs,)](x_arg, w_arg, dummy,
                                 bias if bias is not None else dummy, out, part, counters, M, N, K,
                                 x2.stride(0), w.stride(0), out.stride(0),
                                 HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, FP8=fp8, GLU=glu,
                                 EVEN_K=K % cfg["BLOCK_K"] == 0,
                                 DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                 BLOCK_M=block_m, LINE=min(128 // w.element_size(), cfg["BLOCK_K"]),
                                 THREADS=32 * cfg["num_warps"], TMA=bool(tma), **cfg,
                                 **pdl_args(x2))
    return out.view(*x.shape[:-1], N)
