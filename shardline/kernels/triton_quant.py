"""Triton GEMM for small M (decode): y = (x @ w.T) [* scale] + bias, w int8, fp8 (e4m3) or x's dtype.

int8 and fp8 weights carry a per-output-channel scale; bf16/fp16 weights run the same kernel without one
(HAS_SCALE=False), as one of the candidates `shardline tune-gemm` times against cuBLAS.

Decode is bound by the bytes of the weights, so the kernel streams int8 [N, K] tiles, converts them
to x's dtype in registers for the matrix units and applies the per-output-channel scale once, in
the epilogue (scale is constant along K). Imported only when a CUDA tensor arrives.

Bandwidth needs many tiles in flight, and a [4096, K] weight cut into BLOCK_N=64 rows gives only
64 programs for 132 multiprocessors; so K is split too (SPLIT_K programs per output tile). Each
split writes its fp32 partial to a workspace and bumps the tile's counter; the split that arrives
last sums the partials in a fixed order (deterministic), runs the epilogue and resets the counter
to zero for the next call. Launched with PDL on Hopper (`_dispatch.use_pdl`): each program asks
L2 for its first PREFETCH weight tiles (a config key, default 1; deeper measured no better), then
waits for the kernel before. `AHEAD=D` in the config (default 0, off): every iteration also asks
L2 for the weight tile D tiles on, for more bytes in flight than the ring in shared memory holds.
One launch, no host synchronisation: safe to capture in a CUDA graph
(warm up before capturing, so that the counters are allocated outside the capture). Calls that
share a device must be ordered (one stream), as the counters are shared.

`TMA=1` in the config (Hopper and later): the loop's x and weight tiles come through tensor
descriptors, the copy engine filling shared memory on mbarriers instead of every thread issuing
asynchronous copies (`shardline tune-gemm` times both; on the H200 at batch 64 the 32-layer linear
stack ran 3.94 ms with them against 4.01, docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_args
from .activation import gelu_tanh, silu_and_mul
from .triton_activation import gelu_tanh_f32
from . import trace
from .triton_pdl import pdl_trigger_late, pdl_wait, prefetch_l2
from .triton_pdl import T_EXIT, T_LOOP_END, T_START, T_WAITED, trace_stamp


@triton.jit
def load_tiles(x_ptrs, w_ptrs, up_rows, m_mask, n_mask, k_mask, EVEN_K: tl.constexpr, GLU: tl.constexpr):
    """x [BLOCK_M, BLOCK_K] and the weight tile [BLOCK_N, BLOCK_K] (with GLU also the up tile,
    `up_rows` elements on; else w again), zero outside the row masks and, unless EVEN_K, k_mask.
    Shared by the split-K and stream-K kernels."""
    x_mask, w_mask = m_mask, n_mask
    if not EVEN_K:
        x_mask, w_mask = m_mask & k_mask, n_mask & k_mask
    x = tl.load(x_ptrs, mask=x_mask, other=0.0)
    w = tl.load(w_ptrs, mask=w_mask, other=0)
    u = w
    if GLU:
        u = tl.load(w_ptrs + up_rows, mask=w_mask, other=0)
    return x, w, u


@triton.jit
def prefetch_tile(w_ptr, rows, col0, K, up_rows, BLOCK_K: tl.constexpr, LINE: tl.constexpr, GLU: tl.constexpr):
    """Ask L2 for the weight tile [rows, col0 : col0 + BLOCK_K] (`rows` as element offsets, one
    pointer a LINE-element line; with GLU also the up tile `up_rows` elements on). Shared by the
    split-K and stream-K kernels, which call it before their PDL wait."""
    cols = tl.minimum(col0 + tl.arange(0, BLOCK_K // LINE) * LINE, K - 1)
    prefetch_l2(w_ptr + rows[:, None] + cols[None, :])
    if GLU:
        prefetch_l2(w_ptr + up_rows + rows[:, None] + cols[None, :])


@triton.jit
def multiply_tiles(x, w, u, acc, acc_up, FP8: tl.constexpr, GLU: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += x @ w.T (and acc_up += x @ u.T with GLU), the weights widened to x's dtype; fp8
    weights arrive as their bytes (a masked load cannot fill fp8 with a zero)."""
    if FP8:
        w = w.to(tl.float8e4nv, bitcast=True)
        u = u.to(tl.float8e4nv, bitcast=True)
    acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
    if GLU:
        acc_up = tl.dot(x, tl.trans(u.to(x.dtype)), acc_up, input_precision=DOT_PRECISION)
    return acc, acc_up


@triton.jit
def _int8_linear_kernel(x_ptr, w_ptr, x_desc, w_desc, scale_ptr, bias_ptr, out_ptr, part_ptr, count_ptr, M, N, K,
                        stride_xm, stride_wn, stride_om, ss_in_ptr, ss_parts, eps, res_ptr, stride_res, ss_out_ptr,
                        centre_ptr, best_ptr, first_ptr, greedy_cols, store_ptr, trace_ptr,
                        HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, FP8: tl.constexpr, EVEN_K: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, GLU: tl.constexpr,
                        SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, AHEAD: tl.constexpr, LATE: tl.constexpr,
                        LINE: tl.constexpr, TMA: tl.constexpr, ROW_NORM: tl.constexpr, PARTS_P2: tl.constexpr,
                        RESIDUAL: tl.constexpr, ARGMAX: tl.constexpr, GATE_STORE: tl.constexpr, GELU: tl.constexpr,
                        CENTRED: tl.constexpr, SUMS: tl.constexpr, TRACE: tl.constexpr, USE_PDL: tl.constexpr):
    """GLU: w is the fused [gate; up] projection [2N, K]; the program's tile is BLOCK_N gate rows
    and the BLOCK_N up rows N below them, and it writes silu(gate) * up [M, N]. GELU: it writes
    gelu_tanh(the product + bias) (GPT-J's and GPT-2's up projection). TMA: the loop's
    tiles come through x_desc and w_desc (tensor descriptors: the copy engine fetches them into
    shared memory and zero-fills past the edges); x_ptr and w_ptr still serve the L2 prefetches.
    AHEAD > 0: each iteration also asks L2 for the weight tile AHEAD tiles on (clamped to the
    split's last), so the stream has more bytes in flight than the shared-memory ring holds.

    ROW_NORM: x is a stream whose rows an RMSNorm (weight folded into w) would scale: the
    epilogue multiplies each row by 1 / rms from the partial sums of squares [ss_parts, M] at
    ss_in_ptr (read right after the PDL wait); CENTRED: the norm is a LayerNorm, whose rows' partial
    sums follow the squares' ss_parts rows, and the epilogue first takes each row's mean times
    centre_ptr[n] (weight row n's sum) off the product. RESIDUAL: the output is the stream's next
    value, res + this product, with this tile's partial sums of squares at ss_out_ptr [N tiles, M]
    (SUMS: and its sums N tiles rows after them, for a LayerNorm after).
    ARGMAX (a head's logits): each row's first maximum among this tile's columns below
    greedy_cols, its value at best_ptr and its column at first_ptr [M, N tiles], for
    triton_argmax's pick kernel (greedy sampling without a pass over the logits). GATE_STORE (with
    ARGMAX): the logits are written only where int64 store_ptr[0] is not 0 (quant.GreedyIds.store).
    TRACE: each program's timeline at trace_ptr (shardline/kernels/trace.py)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    program = pid_n + tl.num_programs(0) * (pid_m + tl.num_programs(1) * pid_k)
    trace_stamp(trace_ptr, program, T_START, TRACE)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    up_rows = N * stride_wn
    # This split's share of K, in whole BLOCK_K tiles.
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64) * stride_wn  # the prefetches' weight rows
    if USE_PDL:  # the weights depend on no earlier kernel: the first PREFETCH tiles head for L2, then wait
        for i in tl.static_range(PREFETCH):
            prefetch_tile(w_ptr, rows, tl.minimum(k_lo + i * BLOCK_K, k_hi - 1), K, up_rows, BLOCK_K, LINE, GLU)
    pdl_wait(USE_PDL, LATE)
    trace_stamp(trace_ptr, program, T_WAITED, TRACE)
    # The fold's operands, requested now and first read in the epilogue, so that the loop never
    # waits for them (1 / rms itself is computed there too: a sum here would wait for the loads).
    ss, sums, res = 0.0, 0.0, 0.0  # unused unless ROW_NORM, CENTRED, RESIDUAL
    if ROW_NORM:
        ss = load_partials(ss_in_ptr, ss_parts, offs_m, M, PARTS_P2)
        if CENTRED:
            sums = load_partials(ss_in_ptr + ss_parts * M, ss_parts, offs_m, M, PARTS_P2)
    if RESIDUAL:
        res = tl.load(res_ptr + offs_m[:, None].to(tl.int64) * stride_res + offs_n[None, :],
                      mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_lo + offs_k)[None, :]
    m_mask = offs_m[:, None] < M
    n_mask = offs_n[:, None] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if AHEAD > 0:
            prefetch_tile(w_ptr, rows, tl.minimum(k0 + AHEAD * BLOCK_K, k_hi - 1), K, up_rows, BLOCK_K, LINE, GLU)
        if TMA:  # splits hold whole K tiles, so a tile never reaches into the next split's share
            x = x_desc.load([pid_m * BLOCK_M, k0])
            w = w_desc.load([pid_n * BLOCK_N, k0])
            u = w
            if GLU:  # a gate tile at the edge reads up rows: their columns are masked at the store
                u = w_desc.load([N + pid_n * BLOCK_N, k0])
        else:
            x, w, u = load_tiles(x_ptrs, w_ptrs, up_rows, m_mask, n_mask, (k0 + offs_k[None, :]) < k_hi, EVEN_K, GLU)
        acc, acc_up = multiply_tiles(x, w, u, acc, acc_up, FP8, GLU, DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    trace_stamp(trace_ptr, program, T_LOOP_END, TRACE)
    pdl_trigger_late(USE_PDL, LATE)
    if SPLIT_K > 1:
        out_mask = m_mask & (offs_n[None, :] < N)
        tile_offs = offs_m[:, None] * N + offs_n[None, :]
        PARTS: tl.constexpr = 2 if GLU else 1  # part is [SPLIT_K, PARTS, M, N]
        tl.store(part_ptr + pid_k * PARTS * M * N + tile_offs, acc, mask=out_mask)
        if GLU:
            tl.store(part_ptr + (pid_k * PARTS + 1) * M * N + tile_offs, acc_up, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last split of this tile reduces
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(part_ptr + s * PARTS * M * N + tile_offs, mask=out_mask, other=0.0,
                               cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(part_ptr + (s * PARTS + 1) * M * N + tile_offs, mask=out_mask, other=0.0,
                                      cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)
            _end(acc, acc_up, ss, sums, res, scale_ptr, bias_ptr, out_ptr, ss_out_ptr, centre_ptr, best_ptr, first_ptr,
                 greedy_cols, store_ptr, pid_n, offs_m, offs_n, M, N, K, eps, stride_om, HAS_SCALE, HAS_BIAS, GLU,
                 ROW_NORM, RESIDUAL, ARGMAX, GATE_STORE, GELU, CENTRED, SUMS)
    else:
        _end(acc, acc_up, ss, sums, res, scale_ptr, bias_ptr, out_ptr, ss_out_ptr, centre_ptr, best_ptr, first_ptr,
             greedy_cols, store_ptr, pid_n, offs_m, offs_n, M, N, K, eps, stride_om, HAS_SCALE, HAS_BIAS, GLU,
             ROW_NORM, RESIDUAL, ARGMAX, GATE_STORE, GELU, CENTRED, SUMS)
    trace_stamp(trace_ptr, program, T_EXIT, TRACE)


@triton.jit
def _end(acc, acc_up, ss, sums, res, scale_ptr, bias_ptr, out_ptr, ss_out_ptr, centre_ptr, best_ptr, first_ptr,
         greedy_cols, store_ptr, tile_n, offs_m, offs_n, M, N, K, eps, stride_om, HAS_SCALE: tl.constexpr,
         HAS_BIAS: tl.constexpr, GLU: tl.constexpr, ROW_NORM: tl.constexpr, RESIDUAL: tl.constexpr,
         ARGMAX: tl.constexpr, GATE_STORE: tl.constexpr, GELU: tl.constexpr, CENTRED: tl.constexpr,
         SUMS: tl.constexpr):
    """The split-K kernel's epilogue: the row norm's centring and scale (row factors, so they go
    before the bias like the channel scale), then the plain store or the residual's, then the
    tile's argmax (of the values the store rounds to, whether or not GATE_STORE skips the store)."""
    if ROW_NORM:
        if CENTRED:
            mean, rstd = row_moments(ss, sums, K, eps)
            acc = centre_rows(acc, mean, centre_ptr, offs_n, N)
            if GLU:
                acc_up = centre_rows(acc_up, mean, centre_ptr + N, offs_n, N)
        else:
            rstd = row_rstd(ss, K, eps)
        acc = acc * rstd[:, None]
        if GLU:
            acc_up = acc_up * rstd[:, None]
    if RESIDUAL:
        y = finish(acc, acc_up, scale_ptr, bias_ptr, offs_n, N, out_ptr.dtype.element_ty, HAS_SCALE, HAS_BIAS, GLU,
                   GELU)
        residual_epilogue(y, res, out_ptr, ss_out_ptr, tile_n, offs_m, offs_n, M, N, stride_om, SUMS)
    else:
        keep = True
        if GATE_STORE:
            keep = tl.load(store_ptr) != 0
        y = epilogue(acc, acc_up, scale_ptr, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, HAS_SCALE,
                     HAS_BIAS, GLU, GELU, keep)
        if ARGMAX:
            tile_argmax(y, best_ptr, first_ptr, greedy_cols, tile_n, offs_m, offs_n, M)


@triton.jit
def finish(acc, acc_up, scale_ptr, bias_ptr, offs_n, N, dtype: tl.constexpr,
           HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr = False):
    """acc [* scale] [+ bias]; with GLU, silu(that) * (acc_up [* scale] [+ bias]) where scale and
    bias of the up rows sit N entries on; with GELU, gelu_tanh(that): fp32 values that `dtype`
    holds exactly where the unfused path (the product, then activation.silu_and_mul or
    activation.gelu_tanh's kernel) rounds, but for the last rounding."""
    n_mask = offs_n < N
    y = acc
    if HAS_SCALE:
        y = y * tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if GLU:
        u = acc_up
        if HAS_SCALE:
            u = u * tl.load(scale_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            u += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        g = y.to(dtype).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        y = silu * u.to(dtype).to(tl.float32)
    if GELU:
        y = gelu_tanh_f32(y.to(dtype).to(tl.float32))
    return y


@triton.jit
def epilogue(acc, acc_up, scale_ptr, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om,
             HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr = False,
             keep=True):
    """out[offs_m, offs_n] = finish(...) in out's dtype, stored unless `keep` is false; returns the
    values in out's dtype either way. Shared by the stream-K kernel."""
    dtype = out_ptr.dtype.element_ty
    y = finish(acc, acc_up, scale_ptr, bias_ptr, offs_n, N, dtype, HAS_SCALE, HAS_BIAS, GLU, GELU)
    mask = (offs_m[:, None] < M) & (offs_n < N)[None, :] & keep
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], y.to(dtype), mask=mask)
    return y.to(dtype)


@triton.jit
def tile_argmax(y, best_ptr, first_ptr, cols, tile_n, offs_m, offs_n, M):
    """Each row's first maximum among this tile's columns below `cols` (the stored values `y`):
    its value and column at [offs_m, tile_n] of [M, N tiles] (triton_argmax._pick_kernel's input).
    A tile wholly past `cols` leaves -inf, which no real column loses to."""
    v = tl.where((offs_n < cols)[None, :], y.to(tl.float32), float("-inf"))
    best = tl.max(v, axis=1)
    first = tl.min(tl.where(v == best[:, None], offs_n[None, :], cols), axis=1)
    at = offs_m * tl.num_programs(0) + tile_n
    tl.store(best_ptr + at, best, mask=offs_m < M)
    tl.store(first_ptr + at, first, mask=offs_m < M)


@triton.jit
def load_partials(ss_ptr, parts, offs_m, M, PARTS_P2: tl.constexpr):
    """The `parts` partial sums of squares [parts, M] (fp32) of the rows offs_m of a stream, as the
    product that wrote the stream left them (`residual_epilogue`): [PARTS_P2, len(offs_m)]."""
    p = tl.arange(0, PARTS_P2)
    return tl.load(ss_ptr + p[:, None] * M + offs_m[None, :], mask=(p[:, None] < parts) & (offs_m[None, :] < M),
                   other=0.0)


@triton.jit
def row_rstd(ss, K, eps):
    """1 / rms of the rows of a stream K wide, from load_partials' tile."""
    return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)


@triton.jit
def row_moments(ss, sums, K, eps):
    """Each row's mean and 1 / std (E[x^2] - mean^2, floored at 0) of a stream K wide, from
    load_partials' tiles of its squares and sums: a LayerNorm's."""
    mean = tl.sum(sums, axis=0) / K
    var = tl.maximum(tl.sum(ss, axis=0) / K - mean * mean, 0.0)
    return mean, 1.0 / tl.sqrt(var + eps)


@triton.jit
def centre_rows(acc, mean, centre_ptr, offs_n, N):
    """acc - mean (a row's) * centre (a weight row's sum): the product of the centred rows, as the
    sums of W x - mean * W 1."""
    c = tl.load(centre_ptr + offs_n, mask=offs_n < N, other=0.0)
    return acc - mean[:, None] * c[None, :]


@triton.jit
def residual_epilogue(y, res, out_ptr, ss_ptr, tile_n, offs_m, offs_n, M, N, stride_om, SUMS: tl.constexpr):
    """The stream's next value: out = y (rounded to out's dtype) + res, rounded again, as the
    unfused path's norm kernel adds; and this tile's share of each row's sum of squares of it,
    to ss[tile_n, offs_m], which the next product's `row_rstd` sums (SUMS: and of its sum, to
    ss[tiles + tile_n, offs_m], for `row_moments`)."""
    dtype = out_ptr.dtype.element_ty
    mask = (offs_m[:, None] < M) & (offs_n < N)[None, :]
    s = (y.to(dtype).to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], s, mask=mask)
    sf = tl.where(mask, s.to(tl.float32), 0.0)
    tl.store(ss_ptr + tile_n * M + offs_m, tl.sum(sf * sf, axis=1), mask=offs_m < M)
    if SUMS:
        tl.store(ss_ptr + (tl.num_programs(0) + tile_n) * M + offs_m, tl.sum(sf, axis=1), mask=offs_m < M)


SMALL_M_MAX = 64  # above this the product is compute-bound: dequantise once and use cuBLAS
_counters: dict[torch.device, torch.Tensor] = {}
_outgrown: list[torch.Tensor] = []  # counters a larger grid replaced: captured graphs may still use them


def _tile_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least n zeroed tile counters on `device`, shared by every split-K call there. A buffer
    that a larger grid outgrows is kept, never freed: a CUDA graph captured with it still points
    at it."""
    counters = _counters.get(device)
    if counters is None or counters.numel() < n:
        if counters is not None:
            _outgrown.append(counters)
        counters = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _counters[device] = counters
    return counters


def default_config(M: int, N: int, K: int, num_sms: int) -> dict:
    """BLOCK_N=64 x BLOCK_K=128 tiles; K split until there are two programs per multiprocessor,
    keeping >= 4 K tiles per split, at most 8 splits (4 above M=16, where the fp32 partials
    start to cost real traffic). Chosen from the H200 sweep in benchmarks/kernels_bench.py
    (2026-11-29): at M=1 the 4096-row o/down projections ran 9.1/19.8 us with 8 splits against
    15.3/46.9 unsplit; at M=64, 4 splits beat 8 (o: 16.8 vs 28.1 us)."""
    block_m = 16 if M <= 16 else (32 if M <= 32 else 64)
    cfg = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=128, num_warps=4 if block_m <= 32 else 8,
               num_stages=4)
    tiles = triton.cdiv(N, 64) * triton.cdiv(M, block_m)
    max_split = 8 if M <= 16 else 4
    split = 1
    while tiles * split < 2 * num_sms and K >= 2 * split * 4 * 128 and split < max_split:
        split *= 2
    cfg["SPLIT_K"] = split
    return cfg


def tensor_descriptors(x2: torch.Tensor, w: torch.Tensor, block_m: int, cfg: dict):
    """Descriptors of x's [block_m, BLOCK_K] and w's [BLOCK_N, BLOCK_K] tiles for the TMA loads, or
    (x2, w) when either tensor breaks their rule (16-byte aligned base and row stride): then the
    pointer loads run. Shared by the split-K and stream-K kernels."""
    if not (x2.is_cuda and all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
                               for t in (x2, w))):
        return x2, w
    from triton.tools.tensor_descriptor import TensorDescriptor
    return (TensorDescriptor.from_tensor(x2, [block_m, cfg["BLOCK_K"]]),
            TensorDescriptor.from_tensor(w, [cfg["BLOCK_N"], cfg["BLOCK_K"]]))


def quantized_linear_triton(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor,
                            bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    return small_m_linear_triton(x, w_q, scale, bias, config)


def small_m_linear_triton(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                          bias: torch.Tensor | None = None, config: dict | None = None,
                          glu: bool = False, out_dtype: torch.dtype | None = None, norm=None,
                          residual: torch.Tensor | None = None, greedy=None, gelu: bool = False,
                          centre: torch.Tensor | None = None, sums: bool = False):
    """`w` [N, K] is int8 or fp8 with `scale`, or x's dtype with scale None (then `config` is
    required: the caller chose this kernel over cuBLAS by timing it). With `glu`, w is the fused
    [gate; up] projection [2N, K] and the output silu(gate) * up [.., N]; the tile holds
    BLOCK_N / 2 rows of each half, so a config timed for the plain product streams the same bytes
    a program. `out_dtype` (not with `glu`, which rounds where the unfused path does): the
    output's dtype if not x's; the epilogue rounds the fp32 sum to it once.

    `norm` (a norm.RowNorm of x) and `residual`: the epilogue's fold of the RMSNorm before the
    product and of the residual add after it (quant.small_m_linear); with `residual` the result is
    (the stream's next value, its partial sums of squares [N tiles, M]). `greedy` (a
    quant.GreedyIds): each row's argmax, from the epilogue's per-tile maxima and a pick kernel (and
    the logits stored only where its `store` says so). `gelu`: the output is gelu_tanh(the product
    + bias), in the epilogue. `centre` and `sums`: a LayerNorm's fold (quant.small_m_linear)."""
    assert out_dtype is None or not glu, "SwiGLU's output is x's dtype"
    from ._dispatch import sm_count
    N, K = w.shape
    N = N // 2 if glu else N
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if scale is not None and (M > SMALL_M_MAX or x.dtype == torch.float32) and config is None:
        # Compute-bound (or fp32, whose exact dot spills): dequantise and let cuBLAS multiply.
        w = w.to(x.dtype) * scale.to(x.dtype)[:, None]
        y = torch.nn.functional.linear(x, w, bias)
        y = silu_and_mul(y) if glu else y.to(out_dtype or y.dtype)
        if gelu:
            y = gelu_tanh(y)
        if greedy is not None:
            greedy.take(y)
        return y
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    assert w.stride(-1) == 1, "weight rows must be contiguous"
    cfg = dict(config or default_config(M, 2 * N if glu else N, K, sm_count(x)))
    block_m, split_k = cfg.pop("BLOCK_M", 16 if M <= 16 else 64), cfg.pop("SPLIT_K", 1)
    if glu:
        cfg["BLOCK_N"] = max(cfg["BLOCK_N"] // 2, 16)
    cfg.setdefault("PREFETCH", 1)
    cfg.setdefault("AHEAD", 0)
    cfg.setdefault("LATE", 0)
    out = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return out.view(*x.shape[:-1], N) if residual is None else (out, out.new_zeros((2, 1, 0) if sums else (1, 0),
                                                                                       dtype=torch.float32))
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, block_m), split_k)
    if greedy is not None:  # [M, N tiles] each
        best = torch.empty((M, grid[0]), dtype=torch.float32, device=x.device)
        first = torch.empty((M, grid[0]), dtype=torch.int32, device=x.device)
    else:
        best, first = out, out  # unused
    store = greedy.store if greedy is not None and greedy.store is not None else out  # out: no gate
    fold = FoldArgs(out, grid[0], M, norm, residual, centre, sums)
    if split_k > 1:
        part = torch.empty((split_k, 2 if glu else 1, M, N), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, grid[0] * grid[1])
    else:
        part, counters = out, out  # unused
    dummy = scale if scale is not None else out
    fp8 = w.dtype == torch.float8_e4m3fn
    w_arg = w.view(torch.uint8) if fp8 else w
    x_desc, w_desc = tensor_descriptors(x2, w_arg, block_m, cfg) if cfg.pop("TMA", 0) else (x2, w_arg)
    trace_ptr, traced = trace.buffer(f"split-k {w.shape[0]}x{K}", grid[0] * grid[1] * grid[2], out,
                                     w.numel() * w.element_size())
    _int8_linear_kernel[grid](x2, w_arg, x_desc, w_desc, dummy,
                              bias if bias is not None else dummy, out, part,
                              counters, M, N, K, x2.stride(0), w.stride(0), out.stride(0), *fold.args,
                              best, first, greedy.cols if greedy is not None else 0, store, trace_ptr,
                              TRACE=traced, ARGMAX=greedy is not None, GATE_STORE=store is not out, GELU=gelu,
                              ROW_NORM=norm is not None, PARTS_P2=fold.parts_p2, RESIDUAL=residual is not None,
                              CENTRED=fold.centred, SUMS=fold.sums, HAS_SCALE=scale is not None,
                              HAS_BIAS=bias is not None, FP8=fp8,
                              EVEN_K=K % cfg["BLOCK_K"] == 0,
                              DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", GLU=glu,
                              SPLIT_K=split_k, BLOCK_M=block_m, TMA=x_desc is not x2,
                              LINE=min(128 // w.element_size(), cfg["BLOCK_K"]), **cfg, **pdl_args(x2))
    if greedy is not None:
        from .triton_argmax import pick_rows
        pick_rows(best, first, greedy.out)
    if residual is not None:
        return out, fold.partials
    return out.view(*x.shape[:-1], N)


class FoldArgs:
    """The fold's kernel arguments, shared by the split-K and ring launchers: (ss_in, parts, eps,
    residual, its row stride, ss_out, centre), with `out` standing in for what is absent;
    `partials` the [tiles, M] fp32 partial sums of squares a residual product writes ([2, tiles,
    M] with `sums`: the sums after them); `parts_p2` the power of two that holds norm's partials
    (row_rstd loads them in one tile); `centred` and `sums` the kernels' CENTRED and SUMS: a
    LayerNorm's norm to centre by `centre`, and the sums to leave (the input's sums, when
    centred, lie `parts` rows after its squares)."""

    def __init__(self, out: torch.Tensor, tiles: int, M: int, norm, residual: torch.Tensor | None,
                 centre: torch.Tensor | None = None, sums: bool = False) -> None:
        from ._dispatch import next_pow2
        self.partials = None
        self.centred, self.sums = norm is not None and norm.sums is not None, sums
        ss_in, parts, eps, res, stride_res, ss_out = out, 1, 0.0, out, 0, out
        if norm is not None:
            ss_in, parts, eps = norm.sum_squares, norm.sum_squares.shape[0], norm.eps
            assert norm.sum_squares.shape[1] == M and norm.sum_squares.is_contiguous(), "partials [parts, M]"
            if self.centred and norm.sums.data_ptr() != ss_in.data_ptr() + ss_in.numel() * ss_in.element_size():
                ss_in = torch.stack([norm.sum_squares, norm.sums])  # not one product's [2, parts, M]
        if residual is not None:
            res = residual.reshape(M, -1)
            assert res.shape == out.shape and res.stride(-1) == 1 and res.dtype == out.dtype, \
                "the residual is the output's shape and dtype, its rows contiguous"
            stride_res = res.stride(0)
            shape = (2, tiles, M) if sums else (tiles, M)
            self.partials = ss_out = torch.empty(shape, dtype=torch.float32, device=out.device)
        self.args = (ss_in, parts, eps, res, stride_res, ss_out, centre if self.centred else out)
        self.parts_p2 = next_pow2(parts)
