"""The ring GEMM for decode at 1..64 rows (Hopper): y = x @ W.T [+ bias] [-> silu(gate) * up].

Written in Gluon (Triton's explicit dialect: shared-memory rings, mbarriers, TMA, wgmma and warp
specialisation), because what it does differently from the split-K kernel (triton_quant.py) cannot
be said in plain Triton:

- **The weights stream before the PDL wait.** No kernel writes the weights, so each program's
  producer warp requests its first EARLY weight tiles into shared memory while the kernel ahead
  still drains, as the batch-1 bulk GEMV does; x, which the kernel ahead writes, is requested only
  after the wait. (Plain Triton's pipeliner hoists x's first loads above a wait placed in the loop.)
- **A producer warp of its own.** One warp issues the TMA copies and refills a slot as soon as the
  consumer warpgroup releases it; the consumers only wait, multiply (wgmma, 64 x BLOCK_N a
  stage) and release. The split-K kernel's single instruction stream refills after its wgmma
  returns.

Tiles: one program per BLOCK_N weight rows (with GLU, BLOCK_N / 2 gate rows and the up rows N
below them) and K split SPLIT_K ways in whole BLOCK_K tiles. Or the balanced form (SUB > 0,
quant.ring_plan): the rows, in runs of SUB, are dealt to WAVES programs a multiprocessor as evenly
as whole runs allow, each program's runs landing as boxes in one tile of BLOCK_N rows (a power of
two that holds the most runs a program gets); boxes past a program's runs are requested out of
bounds, which TMA fills with zeros without reading memory. Every program then streams the same
bytes (give or take one run) where the tiles leave a partial last wave: gate/up of Llama-3-8B is
224 tiles of 64 gate rows on 132 multiprocessors, or 132 programs of 6-7 runs of 16. x's 64-row tile is TMA's, which
zero-fills rows past M and columns past K. Split partials go to a workspace and the split that
arrives last at a tile sums them in split order (deterministic) and resets the tile's counter,
as in the split-K kernel, whose counters this shares. One launch, no host synchronisation: safe
to capture in a CUDA graph (warm up first, so that the counters exist before the capture).

bf16 and fp16 weights of x's dtype only; int8 and fp8 stay on the split-K kernel. `shardline
tune-gemm` times it on Hopper among the candidates (impl "ring") and the engine runs it only where
a table chose it. Imported only when a CUDA tensor arrives on a Hopper GPU.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import trace
from ._dispatch import use_pdl
from .quant import RING_MAX_M as MAX_M
from .quant import ring_fits
from .triton_pdl import T_EXIT, T_FIRST, T_LOOP_END, T_SM, T_START, T_WAITED, T_WORDS
from .triton_quant import FoldArgs, _tile_counters

BLOCK_M = gl.constexpr(MAX_M)  # one warpgroup's wgmma rows: x's tile, whatever M <= 64 is


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _stamp(trace_ptr, program, FIELD: gl.constexpr, TRACE: gl.constexpr):
    """shardline/kernels/trace.py's timeline word FIELD of this program (at T_EXIT also its multiprocessor),
    as triton_pdl.trace_stamp writes it."""
    if TRACE:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(trace_ptr + program * T_WORDS + FIELD, now)
        if FIELD == T_EXIT:
            sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)
            gl.store(trace_ptr + program * T_WORDS + T_SM, sm.to(gl.int64))


@gluon.jit
def _request_weights(w_desc, w_ring, bar, slot, row, up_row, k, runs, oob_row, nbytes: gl.constexpr,
                     GLU: gl.constexpr, BLOCK_N: gl.constexpr, pred):
    """Arm `bar` for a stage's `nbytes` and request its weight tile (and with GLU the up tile). In
    the balanced form the tile is BLOCK_N // BOX boxes of BOX rows; boxes past this program's
    `runs` go to `oob_row`, past the weights' last row, so that TMA zero-fills them without reading
    memory and the stage's byte count stays the constant the barrier expects."""
    mbarrier.expect(bar, nbytes, pred=pred)
    WT: gl.constexpr = 2 if GLU else 1
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    if BOX == BLOCK_N:
        tma.async_copy_global_to_shared(w_desc, [row, k], bar, w_ring.index(slot * WT), pred=pred)
        if GLU:
            tma.async_copy_global_to_shared(w_desc, [up_row, k], bar, w_ring.index(slot * WT + 1), pred=pred)
    else:
        for j in gl.static_range(BLOCK_N // BOX):
            live = (j < runs).to(gl.int32)
            r = live * (row + j * BOX) + (1 - live) * oob_row
            tma.async_copy_global_to_shared(w_desc, [r, k], bar, w_ring.index(slot * WT).slice(j * BOX, BOX), pred=pred)
            if GLU:
                u = live * (up_row + j * BOX) + (1 - live) * oob_row
                tma.async_copy_global_to_shared(w_desc, [u, k], bar, w_ring.index(slot * WT + 1).slice(j * BOX, BOX),
                                                pred=pred)


@gluon.jit
def _producer(x_desc, w_desc, x_ring, w_ring, ready, empty, row, up_row, k_lo, k_tiles, runs, oob_row,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, EARLY: gl.constexpr, GLU: gl.constexpr,
              USE_PDL: gl.constexpr):
    """One warp. A stage's `ready` barrier completes when its x tile and weight tile(s) have landed;
    its `empty` barrier when the consumers are done with it."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BOXES: gl.constexpr = BLOCK_N // w_desc.block_type.shape[0]
    nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes * BOXES * (2 if GLU else 1)
    for s in gl.static_range(EARLY):  # the weights depend on no kernel ahead
        _request_weights(w_desc, w_ring, ready.index(s), s, row, up_row, k_lo + s * BLOCK_K, runs, oob_row, nbytes,
                         GLU, BLOCK_N, s < k_tiles)
    if USE_PDL:
        _gdc_wait()
    for i in range(k_tiles):
        slot = i % STAGES
        k = k_lo + i * BLOCK_K
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), (i // STAGES - 1) & 1)
        if i >= EARLY:
            _request_weights(w_desc, w_ring, ready.index(slot), slot, row, up_row, k, runs, oob_row, nbytes, GLU,
                             BLOCK_N, True)
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(slot), x_ring.index(slot))


@gluon.jit
def _consumer(x_ring, w_ring, ready, empty, k_tiles, ss_in_ptr, ss_parts, eps, res_ptr, stride_res, M, K, row,
              row_end, trace_ptr, program, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GLU: gl.constexpr,
              ROW_NORM: gl.constexpr, PARTS_P2: gl.constexpr, RESIDUAL: gl.constexpr, CENTRED: gl.constexpr,
              USE_PDL: gl.constexpr, LATE: gl.constexpr, TRACE: gl.constexpr, num_warps: gl.constexpr):
    """The warpgroup: acc (and acc_up) [64, BLOCK_N] fp32 over this split's K tiles; with the fold,
    also each row's 1 / rms (ROW_NORM; CENTRED, a LayerNorm's: its mean and 1 / std) and the
    residual's tile (RESIDUAL), requested right after the PDL wait so that they land while the
    loop runs."""
    if USE_PDL:
        _gdc_wait()
        if not LATE:
            _gdc_launch_dependents()
    _stamp(trace_ptr, program, T_WAITED, TRACE)
    out_layout: gl.constexpr = _out_layout(num_warps)
    res = gl.full((BLOCK_M,), 1.0, gl.float32, layout=gl.SliceLayout(1, out_layout))  # a placeholder unless RESIDUAL
    ss, sums = fold_loads(ss_in_ptr, ss_parts, M, ROW_NORM, CENTRED, PARTS_P2, num_warps)
    if RESIDUAL:
        offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
        offs_n = row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
        mask = (offs_m[:, None] < M) & (offs_n < row_end)[None, :]
        res = gl.load(res_ptr + offs_m[:, None] * stride_res + offs_n[None, :], mask=mask, other=0.0).to(gl.float32)
    WT: gl.constexpr = 2 if GLU else 1
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    acc_up = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    for i in range(k_tiles):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        if TRACE:
            if i == 0:
                _stamp(trace_ptr, program, T_FIRST, TRACE)
        x = x_ring.index(slot)
        acc = warpgroup_mma(x, w_ring.index(slot * WT).permute((1, 0)), acc, is_async=True)
        if GLU:
            acc_up = warpgroup_mma(x, w_ring.index(slot * WT + 1).permute((1, 0)), acc_up, is_async=True)
        acc, acc_up = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_up))
        mbarrier.arrive(empty.index(slot))
    if USE_PDL:
        if LATE:  # the kernel after this one launches once every program gets here
            _gdc_launch_dependents()
    rstd, mean = fold_factors(ss, sums, K, eps, ROW_NORM, CENTRED, num_warps)
    return acc, acc_up, rstd, res, mean


@gluon.jit
def fold_loads(ss_in_ptr, ss_parts, M, ROW_NORM: gl.constexpr, CENTRED: gl.constexpr, PARTS_P2: gl.constexpr,
               num_warps: gl.constexpr):
    """The norm fold's operands, requested right after the PDL wait and summed after the loop
    (fold_factors; a sum here would wait for the loads): the rows' partial sums of squares
    [ss_parts, M] and, CENTRED, their sums after them. Placeholders without ROW_NORM."""
    ss_layout: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [num_warps, 1], [1, 0])
    p = gl.arange(0, PARTS_P2, layout=gl.SliceLayout(1, ss_layout))
    m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ss_layout))
    live = (p[:, None] < ss_parts) & (m[None, :] < M)
    ss = gl.zeros((PARTS_P2, BLOCK_M), gl.float32, layout=ss_layout)
    sums = ss
    if ROW_NORM:
        ss = gl.load(ss_in_ptr + p[:, None] * M + m[None, :], mask=live, other=0.0)
        if CENTRED:  # the rows' sums follow their squares
            sums = gl.load(ss_in_ptr + (ss_parts + p[:, None]) * M + m[None, :], mask=live, other=0.0)
    return ss, sums


@gluon.jit
def fold_factors(ss, sums, K, eps, ROW_NORM: gl.constexpr, CENTRED: gl.constexpr, num_warps: gl.constexpr):
    """(1 / rms or 1 / std, mean) of each x row, in the epilogue's row layout (ones and zeros
    without ROW_NORM and CENTRED)."""
    rows: gl.constexpr = gl.SliceLayout(1, _out_layout(num_warps))
    rstd = gl.full((BLOCK_M,), 1.0, gl.float32, layout=rows)
    mean = gl.full((BLOCK_M,), 0.0, gl.float32, layout=rows)
    if ROW_NORM:
        second = gl.sum(ss, axis=0) / K
        if CENTRED:  # E[x^2] - mean^2, floored at 0, as triton_quant.row_moments
            mu = gl.sum(sums, axis=0) / K
            second = gl.maximum(second - mu * mu, 0.0)
            mean = gl.convert_layout(mu, rows)
        rstd = gl.convert_layout(1.0 / gl.sqrt(second + eps), rows)
    return rstd, mean


@gluon.constexpr_function
def _out_layout(num_warps):
    """The epilogue's layout (and the fold's operands', loaded in it by the consumers)."""
    return gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])


@gluon.jit
def _ring_linear_kernel(x_desc, w_desc, bias_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_om,
                        total_runs, programs, oob_row, ss_in_ptr, ss_parts, eps, res_ptr, stride_res, ss_out_ptr,
                        centre_ptr, trace_ptr, BLOCK_N: gl.constexpr, HAS_BIAS: gl.constexpr, GLU: gl.constexpr,
                        SPLIT_K: gl.constexpr, STAGES: gl.constexpr, EARLY: gl.constexpr, ROW_NORM: gl.constexpr,
                        PARTS_P2: gl.constexpr, RESIDUAL: gl.constexpr, CENTRED: gl.constexpr, SUMS: gl.constexpr,
                        USE_PDL: gl.constexpr, LATE: gl.constexpr, TRACE: gl.constexpr, num_warps: gl.constexpr):
    """ROW_NORM and RESIDUAL: the fold of the RMSNorm before the product and the residual add
    after it, as in the split-K kernel (triton_quant.py: row_rstd, residual_epilogue); CENTRED and
    SUMS a LayerNorm's (row_moments, centre_rows). TRACE: each program's timeline at trace_ptr
    (shardline/kernels/trace.py)."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    WT: gl.constexpr = 2 if GLU else 1
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    program = pid_n + gl.num_programs(0) * pid_k
    _stamp(trace_ptr, program, T_START, TRACE)
    if BOX == BLOCK_N:  # tiles of BLOCK_N rows
        row = pid_n * BLOCK_N
        runs = 1
        row_end = gl.minimum(row + BLOCK_N, N)
    else:  # balanced: program p takes runs [p * R // P, (p + 1) * R // P) of BOX rows
        first = pid_n * total_runs // programs
        runs = (pid_n + 1) * total_runs // programs - first
        row = first * BOX
        row_end = gl.minimum(row + runs * BOX, N)
    k_tiles_all = gl.cdiv(K, BLOCK_K)
    per_split = gl.cdiv(k_tiles_all, SPLIT_K)
    k_lo = pid_k * per_split * BLOCK_K
    k_tiles = gl.maximum(gl.minimum(per_split, k_tiles_all - pid_k * per_split), 0)

    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES * WT, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    acc, acc_up, rstd, res, mean = gl.warp_specialize(
        [(_consumer, (x_ring, w_ring, ready, empty, k_tiles, ss_in_ptr, ss_parts, eps, res_ptr, stride_res, M, K,
                      row, row_end, trace_ptr, program, BLOCK_N, STAGES, GLU, ROW_NORM, PARTS_P2, RESIDUAL, CENTRED,
                      USE_PDL, LATE, TRACE, num_warps)),
         (_producer, (x_desc, w_desc, x_ring, w_ring, ready, empty, row, N + row, k_lo, k_tiles, runs, oob_row,
                      BLOCK_N, STAGES, EARLY, GLU, USE_PDL))],
        [1], [40])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    _stamp(trace_ptr, program, T_LOOP_END, TRACE)

    out_layout: gl.constexpr = _out_layout(num_warps)
    acc = gl.convert_layout(acc, out_layout)
    acc_up = gl.convert_layout(acc_up, out_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_n = row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    n_mask = offs_n < row_end
    mask = (offs_m[:, None] < M) & n_mask[None, :]
    if SPLIT_K > 1:
        if not split_k_arrive(acc, acc_up, part_ptr, count_ptr, pid_n, pid_k, offs_m, offs_n, mask, M, N, SPLIT_K,
                              GLU):
            _stamp(trace_ptr, program, T_EXIT, TRACE)
            return
        acc, acc_up = split_k_sum(part_ptr, count_ptr, pid_n, offs_m, offs_n, mask, M, N, SPLIT_K, GLU, False,
                                  num_warps)
    finish(acc, acc_up, rstd, res, mean, offs_m, offs_n, n_mask, mask, bias_ptr, centre_ptr, out_ptr, stride_om,
           ss_out_ptr, pid_n, M, N, HAS_BIAS, GLU, ROW_NORM, RESIDUAL, CENTRED, SUMS)
    _stamp(trace_ptr, program, T_EXIT, TRACE)


@gluon.jit
def split_k_arrive(acc, acc_up, part_ptr, count_ptr, tile, pid_k, offs_m, offs_n, mask, M, N, SPLIT_K: gl.constexpr,
                   GLU: gl.constexpr):
    """Leave this split's sums of tile `tile` (acc, and acc_up with GLU) in part [SPLIT_K, 2 if GLU
    else 1, M, N] fp32 and count it in; true in the tile's last split to arrive, which sums them
    (split_k_sum) and runs the epilogue. Shared by the ring and the 12-bit kernel."""
    WT: gl.constexpr = 2 if GLU else 1
    tile_offs = offs_m[:, None] * N + offs_n[None, :]
    gl.store(part_ptr + pid_k * WT * M * N + tile_offs, acc, mask=mask)
    if GLU:
        gl.store(part_ptr + (pid_k * WT + 1) * M * N + tile_offs, acc_up, mask=mask)
    gl.thread_barrier()  # every thread's partial is written before the counter moves
    arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return arrived == SPLIT_K - 1


@gluon.jit
def split_k_sum(part_ptr, count_ptr, tile, offs_m, offs_n, mask, M, N, SPLIT_K: gl.constexpr, GLU: gl.constexpr,
                ROLLED: gl.constexpr, num_warps: gl.constexpr):
    """(acc, acc_up): every split's partials of tile `tile` summed, in the epilogue's layout, and
    its counter reset for the next call. ROLLED: a loop over the splits, not unrolled (every
    split's loads at once spill the 12-bit kernel's 8 warps)."""
    WT: gl.constexpr = 2 if GLU else 1
    out_layout: gl.constexpr = _out_layout(num_warps)
    tile_offs = offs_m[:, None] * N + offs_n[None, :]
    acc = gl.zeros(tile_offs.shape, dtype=gl.float32, layout=out_layout)
    acc_up = gl.zeros(tile_offs.shape, dtype=gl.float32, layout=out_layout)
    if ROLLED:
        for s in range(SPLIT_K):
            acc += gl.load(part_ptr + s * WT * M * N + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if GLU:
                acc_up += gl.load(part_ptr + (s * WT + 1) * M * N + tile_offs, mask=mask, other=0.0,
                                  cache_modifier=".cg")
    else:
        for s in gl.static_range(SPLIT_K):
            acc += gl.load(part_ptr + s * WT * M * N + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if GLU:
                acc_up += gl.load(part_ptr + (s * WT + 1) * M * N + tile_offs, mask=mask, other=0.0,
                                  cache_modifier=".cg")
    gl.atomic_xchg(count_ptr + tile, 0)
    return acc, acc_up


@gluon.jit
def finish(acc, acc_up, rstd, res, mean, offs_m, offs_n, n_mask, mask, bias_ptr, centre_ptr, out_ptr, stride_om,
           ss_out_ptr, pid_n, M, N, HAS_BIAS: gl.constexpr, GLU: gl.constexpr, ROW_NORM: gl.constexpr,
           RESIDUAL: gl.constexpr, CENTRED: gl.constexpr, SUMS: gl.constexpr):
    """The epilogue of a [x rows, output columns] tile of sums (acc; acc_up the up rows' with GLU),
    in _out_layout: the fold's row factors, the bias, SwiGLU, the residual add and its partial
    sums of squares, the store. Shared by the ring and the 12-bit kernel (gluon_exp12.py)."""
    # The epilogue rounds where the unfused path (the product, then the activation) rounds.
    dtype: gl.constexpr = out_ptr.dtype.element_ty
    if ROW_NORM:  # row factors, so before the bias
        if CENTRED:  # W (x - mean) = W x - mean * (W's row sums)
            acc -= mean[:, None] * gl.load(centre_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
            if GLU:
                acc_up -= mean[:, None] * gl.load(centre_ptr + N + offs_n, mask=n_mask, other=0.0)[None, :]
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    y = acc
    if HAS_BIAS:
        y += gl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(gl.float32)[None, :]
    if GLU:
        u = acc_up
        if HAS_BIAS:
            u += gl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(gl.float32)[None, :]
        g = y.to(dtype).to(gl.float32)
        silu = (g / (1.0 + gl.exp(-g))).to(dtype).to(gl.float32)
        y = silu * u.to(dtype).to(gl.float32)
    if RESIDUAL:  # the stream's next value, rounded as the norm kernel's add, and its squares' share
        y = (y.to(dtype).to(gl.float32) + res).to(dtype).to(gl.float32)
        sq = gl.where(mask, y * y, 0.0)
        gl.store(ss_out_ptr + pid_n * M + offs_m, gl.sum(sq, axis=1), mask=offs_m < M)
        if SUMS:
            gl.store(ss_out_ptr + (gl.num_programs(0) + pid_n) * M + offs_m, gl.sum(gl.where(mask, y, 0.0), axis=1),
                     mask=offs_m < M)
    gl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(dtype), mask=mask)


def ring_linear_gluon(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, cfg: dict, plan: dict,
                      glu: bool = False, out_dtype: torch.dtype | None = None, norm=None,
                      residual: torch.Tensor | None = None, centre: torch.Tensor | None = None, sums: bool = False):
    """y [.., N] (or [.., N/2] with `glu`, w then the fused [gate; up] projection) for x [.., K]
    and w [N, K]; `out_dtype` (not with `glu`): the output's dtype if not x's. `cfg` and `plan`:
    quant.ring_config's validated config and quant.ring_plan's tile and grid for these operands
    (quant.ring_linear, the one caller, makes both on every device). `norm` and `residual`: the
    fold, as quant.small_m_linear's (with `residual` the result is (stream, partial sums of squares)),
    and `centre` and `sums` a LayerNorm's."""
    reason = ring_fits(x, w)
    if reason is not None:
        raise ValueError(reason)
    assert out_dtype is None or not glu, "SwiGLU's output is x's dtype"
    N2, K = w.shape
    N = N2 // 2 if glu else N2
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1 or x2.data_ptr() % 16 or (x2.stride(0) * x2.element_size()) % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # TMA's rules; a fresh allocation is aligned
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out.view(*x.shape[:-1], N) if residual is None else (out, out.new_zeros((2, 1, M) if sums else (1, M),
                                                                                       dtype=torch.float32))
    fold = FoldArgs(out, plan["grid"][0], M, norm, residual, centre, sums)
    block_n, block_k, stages, split_k = plan["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"], cfg["SPLIT_K"]
    early = min(cfg.get("EARLY", stages), stages)
    elem = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    x_desc = TensorDescriptor.from_tensor(x2, [MAX_M, block_k], gl.NVMMASharedLayout.get_default_for([MAX_M, block_k], elem))
    # The box is the whole tile, or one run of the balanced form landing in a slice of the tile:
    # either way in the tile's shared layout.
    w_desc = TensorDescriptor.from_tensor(w, [plan["BOX"], block_k],
                                          gl.NVMMASharedLayout.get_default_for([block_n, block_k], elem))
    if split_k > 1:
        part = torch.empty((split_k, 2 if glu else 1, M, N), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, plan["grid"][0])
    else:
        part, counters = out, out  # unused
    pdl = use_pdl(x2)
    cap = {"maxnreg": cfg["MAXNREG"]} if cfg.get("MAXNREG") else {}
    trace_ptr, traced = trace.buffer(f"ring {N2}x{K}", plan["grid"][0] * plan["grid"][1], out,
                                     w.numel() * w.element_size())
    _ring_linear_kernel[plan["grid"]](
        x_desc, w_desc, bias if bias is not None else out, out, part, counters, M, N, K, out.stride(0),
        plan["runs"], plan["programs"], N2, *fold.args, trace_ptr, BLOCK_N=block_n,
        HAS_BIAS=bias is not None, GLU=glu, SPLIT_K=split_k, STAGES=stages, EARLY=early,
        ROW_NORM=norm is not None, PARTS_P2=fold.parts_p2, RESIDUAL=residual is not None, CENTRED=fold.centred,
        SUMS=fold.sums, USE_PDL=pdl,
        LATE=bool(cfg.get("LATE", 0)), TRACE=traced,
        num_warps=4, launch_pdl=pdl, **cap)
    if residual is not None:
        return out, fold.partials
    return out.view(*x.shape[:-1], N)
