"""Triton KV-cache write and paged attention. Imported only when a CUDA tensor arrives.

Layouts are attention.py's. Two attention kernels, both free of host synchronisation and launched
on grids derived from tensor shapes alone, so a decode step can be captured in a CUDA graph:

* `_decode_kernel`, one program per (query row, kv head, context split): the row's whole GQA group
  of query heads shares each K/V tile read from the paged cache, softmax is online, and long
  contexts are cut into NUM_SPLITS pieces whose partial results `_combine_kernel` merges (split-K,
  "flash-decoding"). Each row finds its sequence by counting query_start_loc entries, so the kernel
  is correct for any batch; it is fast when rows are single decode tokens.
* `_prefill_kernel`, flash-attention tiled over (block of BLOCK_Q query tokens x the group's heads)
  and BLOCK_N keys, causal, for batches holding prefill chunks. A sequence's query blocks are
  numbered from query_start_loc[b] // BLOCK_Q + b, which never overlap, so the grid is
  cdiv(T, BLOCK_Q) + B programs and the extra ones return at once.

Softmax runs in the exp2 domain (scale folded with log2 e), accumulation in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _dispatch
from ._dispatch import next_pow2, pdl_args, sm_count
from . import trace
from .triton_pdl import T_EXIT, T_LOOP_END, T_START, T_WAITED, pdl_trigger_late, pdl_wait, trace_stamp
from .attention import NO_SCALES, KVScales, inverse, is_fp8
from .triton_rotary import as_cached, load_rotated

_LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_c_slot, stride_c_h,
                     n_kv_heads, k_inv_scale, v_inv_scale, HEAD_DIM: tl.constexpr, HEADS_P2: tl.constexpr,
                     HEAD_DIM_P2: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding row of a captured batch
        return
    heads = tl.arange(0, HEADS_P2)[:, None]
    dims = tl.arange(0, HEAD_DIM_P2)[None, :]
    mask = (heads < n_kv_heads) & (dims < HEAD_DIM)
    dst = slot * stride_c_slot + heads * stride_c_h + dims
    k = tl.load(k_ptr + t * stride_k_t + heads * stride_k_h + dims, mask=mask)
    tl.store(k_cache_ptr + dst, as_cached(k, k_cache_ptr, k_inv_scale), mask=mask)
    v = tl.load(v_ptr + t * stride_v_t + heads * stride_v_h + dims, mask=mask)
    tl.store(v_cache_ptr + dst, as_cached(v, v_cache_ptr, v_inv_scale), mask=mask)


def write_kv_triton(k, v, k_cache, v_cache, slot_mapping, kv_scales: KVScales = NO_SCALES) -> None:
    T, nkv, hd = k.shape
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    kc, vc = k_cache.view(-1, nkv, hd), v_cache.view(-1, nkv, hd)  # (slots, nkv, hd)
    assert kc.stride() == vc.stride(), "k_cache and v_cache must share one layout"
    if T:
        _write_kv_kernel[(T,)](k, v, kc, vc, slot_mapping, k.stride(0), k.stride(1), v.stride(0),
                               v.stride(1), kc.stride(0), kc.stride(1), nkv, inverse(kv_scales.k),
                               inverse(kv_scales.v), HEAD_DIM=hd,
                               HEADS_P2=next_pow2(nkv), HEAD_DIM_P2=next_pow2(hd), num_warps=4, **pdl_args(k))


@triton.jit
def _tile_blocks(bt_row_ptr, offs_n, mask_n, BLOCK_SIZE: tl.constexpr, OPAQUE_BT: tl.constexpr = False):
    """The cache block of each sequence position offs_n (one load serves the K and the V tile).

    OPAQUE_BT: read the block ids with inline PTX, which Triton's pipeliner does not see as a load.
    Seen as a load, it takes a pipeline stage of its own ahead of the K/V tiles that depend on it,
    which leaves those one shared buffer, so a tile's copy is waited for whole (cp.async.wait_group
    0) before its math and the next copy is issued only after it; unseen, num_stages S gives the
    tiles S - 1 buffers and S - 2 tiles in flight during the math. (Masked lanes read entry 0.)"""
    if OPAQUE_BT:
        ptrs = bt_row_ptr + tl.where(mask_n, offs_n // BLOCK_SIZE, 0)
        blk = tl.inline_asm_elementwise("ld.global.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=True,
                                        pack=1)
    else:
        blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=mask_n, other=0)
    return blk.to(tl.int64)


@triton.jit
def _load_kv_tile(cache_ptr, blk, offs_n, mask_n, dims, dmask, kvh,
                  stride_blk, stride_tok, stride_h, BLOCK_SIZE: tl.constexpr):
    """[BLOCK_N, HEAD_DIM_P2] tile of one kv head for the sequence positions offs_n, in blocks blk."""
    base = blk * stride_blk + (offs_n % BLOCK_SIZE) * stride_tok + kvh * stride_h
    return tl.load(cache_ptr + base[:, None] + dims[None, :],
                   mask=mask_n[:, None] & dmask[None, :], other=0.0)


@triton.jit
def _load_kv_tiles(k_cache_ptr, v_cache_ptr, bt_row, offs_n, mask_n, d, dmask, kvh, stride_k_blk, stride_k_tok,
                   stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE: tl.constexpr,
                   OPAQUE_BT: tl.constexpr = False):
    """The K and the V tile, (N, D) each, of one kv head at the sequence positions offs_n."""
    blk = _tile_blocks(bt_row, offs_n, mask_n, BLOCK_SIZE, OPAQUE_BT)
    k = _load_kv_tile(k_cache_ptr, blk, offs_n, mask_n, d, dmask, kvh, stride_k_blk, stride_k_tok, stride_k_h,
                      BLOCK_SIZE)
    v = _load_kv_tile(v_cache_ptr, blk, offs_n, mask_n, d, dmask, kvh, stride_v_blk, stride_v_tok, stride_v_h,
                      BLOCK_SIZE)
    return k, v


@triton.jit
def _dot_dtype_for_cache(q, cache_ptr):
    """q in the type of its dots with the cache's tiles: its own, but fp16 for a bf16 q over an
    e4m3 cache. e4m3 widens to fp16 in one instruction a pair and to bf16 through fp32, which made
    the decode step over an e4m3 cache slower than over bf16 (kernels_bench --only decode-fp8,
    H200, call w2: 84.6 against 93.2 us at 64 rows of 1,024 tokens, the bf16 tile;
    decode-fp8-sweep-h200-2026-12-01w2.txt). fp16 holds every bf16 q of its range (q is
    clamped to it) and rounds the probabilities finer than bf16; the products sum in fp32 either way."""
    if cache_ptr.dtype.element_ty == tl.float8e4nv:  # two static tests: `&` of them is not static
        if q.dtype == tl.bfloat16:
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    return q


@triton.jit
def _scaled_by_v(out, v_cache_ptr, v_scale):
    """Attention's output over the stored values, times an e4m3 cache's v scale (static: any other
    cache's output is left as it is)."""
    if v_cache_ptr.dtype.element_ty == tl.float8e4nv:
        out = out * v_scale
    return out


@triton.jit
def _online_softmax_step(q, k, v, visible, acc, l_i, m_i, scale_log2, DOT_PRECISION: tl.constexpr,
                         MASKED: tl.constexpr = True):
    """Fold one K/V tile into the running (acc, l, m) of the rows of q; `visible` masks the scores
    (unless not MASKED: every key visible). A row must see at least one key of its first tile (the
    callers' key 0) to keep m finite."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * scale_log2  # (M, N)
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _find_sequence(qsl_ptr, num_seqs, target, BLOCK_Q: tl.constexpr, SEQS_BLOCK: tl.constexpr):
    """The last sequence b whose first query row (BLOCK_Q == 1: query_start_loc[b]) or first query
    block (query_start_loc[b] // BLOCK_Q + b) is <= target; 0 if none. It scans the sequences
    SEQS_BLOCK at a time, so one compile serves every batch size: a kernel specialized on the
    batch (its power of two, or a count divisible by 16) compiled for ~0.8 s while a replica
    served, the first time a step met that batch (docs/benchmarks.md, session s)."""
    count = tl.zeros((), dtype=tl.int32)
    for s0 in range(0, num_seqs, SEQS_BLOCK):
        seqs = s0 + tl.arange(0, SEQS_BLOCK)
        live = seqs < num_seqs
        starts = tl.load(qsl_ptr + seqs, mask=live, other=0)
        first = starts // BLOCK_Q + seqs if BLOCK_Q > 1 else starts
        count += tl.sum((live & (first <= target)).to(tl.int32), axis=0)
    return tl.maximum(count - 1, 0)


@triton.jit
def _write_new_token(k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, cs_row, row, row64, kvh, d, dmask,
                     stride_kn_t, stride_kn_h, stride_vn_t, stride_vn_h, stride_k_blk, stride_k_tok, stride_k_h,
                     stride_v_blk, stride_v_tok, stride_v_h, k_inv_scale, v_inv_scale, pred,
                     HALF: tl.constexpr, ROT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The row's new key (rotated) and value of head kvh as the cache holds them, written to the
    row's slot where `pred` (this split holds the new token) and the slot is >= 0 (padding rows of
    a captured batch write nowhere); masked loads where not `pred`."""
    live = dmask & pred
    k = as_cached(load_rotated(k_new_ptr + row64 * stride_kn_t + kvh * stride_kn_h, d, live, cs_row, HALF, ROT),
                  k_cache_ptr, k_inv_scale)
    v = as_cached(tl.load(v_new_ptr + row64 * stride_vn_t + kvh * stride_vn_h + d, mask=live, other=0.0),
                  v_cache_ptr, v_inv_scale)
    slot = tl.load(slot_ptr + row, mask=pred, other=-1).to(tl.int64)
    blk, off = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    store = live & (slot >= 0)
    tl.store(k_cache_ptr + blk * stride_k_blk + off * stride_k_tok + kvh * stride_k_h + d, k, mask=store)
    tl.store(v_cache_ptr + blk * stride_v_blk + off * stride_v_tok + kvh * stride_v_h + d, v, mask=store)
    return k, v


@triton.jit(do_not_specialize=["num_seqs"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr,
                   part_out_ptr, part_lse_ptr, scale_log2, v_scale, num_seqs, num_heads,
                   stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_bt,
                   stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
                   k_new_ptr, v_new_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
                   stride_kn_t, stride_kn_h, stride_vn_t, stride_vn_h, stride_cs, k_inv_scale, v_inv_scale,
                   trace_ptr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                   HEAD_DIM_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                   NUM_SPLITS: tl.constexpr, SEQS_BLOCK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   ROTARY: tl.constexpr, HALF: tl.constexpr, ROT: tl.constexpr, ONE_ROW: tl.constexpr,
                   EARLY_KV: tl.constexpr, OPAQUE_BT: tl.constexpr, LATE: tl.constexpr, TRACE: tl.constexpr,
                   USE_PDL: tl.constexpr, NEW_FIRST: tl.constexpr = False):
    """`scale_log2` holds an fp8 cache's k scale, and an fp8 cache's output is multiplied by
    `v_scale` (KVScales: the products run on the stored values); the new token is written times
    `k_inv_scale` and `v_inv_scale` (ROTARY).

    ROTARY: q, k_new and v_new are the step's unrotated projections (one query row per
    sequence). The kernel rotates q and the row's new key, writes the new key and value to the
    row's cache slot (skipped when the slot is < 0) and attends over the new token from registers:
    the rotary kernel and the cache write need no launch of their own.

    ONE_ROW: every sequence has exactly one query row, in order (a decode step), so row r is
    sequence r and sees all its seq_len keys; no search of query_start_loc. Under PDL the program
    reads the step's metadata before its wait: the host wrote it before the step's first kernel,
    and only q and the new token come from the kernel ahead.

    NEW_FIRST (ROTARY): the new key and value are read, rotated and written right after the wait,
    beside q, and held in registers through the loop, rather than after it, so that their round
    trip to L2 overlaps the cached tiles instead of following them (an A/B key, off).

    TRACE: each program's timeline at trace_ptr (shardline/kernels/trace.py)."""
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    program = row + tl.num_programs(0) * (kvh + tl.num_programs(1) * split)
    trace_stamp(trace_ptr, program, T_START, TRACE)
    if ONE_ROW:
        b = row
        kv_len = tl.load(seq_lens_ptr + row)
    else:
        # The row's sequence: the last b with query_start_loc[b] <= row.
        b = _find_sequence(qsl_ptr, num_seqs, row, 1, SEQS_BLOCK)
        q_start = tl.load(qsl_ptr + b)
        q_end = tl.load(qsl_ptr + b + 1)
        seq_len = tl.load(seq_lens_ptr + b)
        # Causal: this row sees keys [0, kv_len). Rows past the last sequence see none (output 0).
        kv_len = tl.minimum(seq_len - (q_end - q_start) + (row - q_start) + 1, seq_len)
        kv_len = tl.where(row < q_end, tl.maximum(kv_len, 0), 0)
    per_split = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, kv_len)

    g = tl.arange(0, GROUP_P2)
    d = tl.arange(0, HEAD_DIM_P2)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    row64 = row.to(tl.int64)
    q_rows = q_ptr + row64 * stride_q_t + heads[:, None] * stride_q_h
    q_mask = gmask[:, None] & dmask[None, :]
    # The new key comes from registers (ROTARY, below), not the cache.
    hi_cached = tl.minimum(hi, kv_len - 1) if ROTARY else hi
    holds_new = (kv_len > 0) & (kv_len - 1 >= lo) & (kv_len - 1 < hi)  # this split holds the new token (ROTARY)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if ROTARY:
        cs_row = cos_sin_ptr + tl.load(pos_ptr + row).to(tl.int64) * stride_cs
    if EARLY_KV:  # the first cached tile, read before the wait: an earlier step wrote it
        offs0 = lo + tl.arange(0, BLOCK_N)
        mask0 = offs0 < hi_cached
        k0, v0 = _load_kv_tiles(k_cache_ptr, v_cache_ptr, bt_row, offs0, mask0, d, dmask, kvh, stride_k_blk,
                                stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE)
    pdl_wait(USE_PDL, LATE)
    trace_stamp(trace_ptr, program, T_WAITED, TRACE)
    if ROTARY:
        q = load_rotated(q_rows, d[None, :], q_mask, cs_row, HALF, ROT)  # (G, D)
        if NEW_FIRST:  # the new token's loads beside q's, so that their round trip overlaps the loop
            k_first, v_first = _write_new_token(k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, cs_row, row,
                                                row64, kvh, d, dmask, stride_kn_t, stride_kn_h, stride_vn_t,
                                                stride_vn_h, stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk,
                                                stride_v_tok, stride_v_h, k_inv_scale, v_inv_scale, holds_new, HALF,
                                                ROT, BLOCK_SIZE)
    else:
        q = tl.load(q_rows + d[None, :], mask=q_mask, other=0.0)  # (G, D)
    q = _dot_dtype_for_cache(q, k_cache_ptr)
    m_i = tl.full([GROUP_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)
    first = lo
    if EARLY_KV:
        if lo < hi_cached:  # an empty tile would leave m at -inf and the rescale at NaN
            acc, l_i, m_i = _online_softmax_step(q, k0, v0, mask0[None, :], acc, l_i, m_i, scale_log2,
                                                 DOT_PRECISION)
        first = lo + BLOCK_N
    for n0 in range(first, hi_cached, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi_cached
        k, v = _load_kv_tiles(k_cache_ptr, v_cache_ptr, bt_row, offs_n, mask_n, d, dmask, kvh, stride_k_blk,
                              stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE, OPAQUE_BT)
        acc, l_i, m_i = _online_softmax_step(q, k, v, mask_n[None, :], acc, l_i, m_i, scale_log2, DOT_PRECISION)
    trace_stamp(trace_ptr, program, T_LOOP_END, TRACE)
    pdl_trigger_late(USE_PDL, LATE)
    if ROTARY:
        if holds_new:
            if not NEW_FIRST:
                k_tok, v_tok = _write_new_token(k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, cs_row, row,
                                                row64, kvh, d, dmask, stride_kn_t, stride_kn_h, stride_vn_t,
                                                stride_vn_h, stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk,
                                                stride_v_tok, stride_v_h, k_inv_scale, v_inv_scale, True, HALF, ROT,
                                                BLOCK_SIZE)
            else:
                k_tok, v_tok = k_first, v_first
            # The new key as the cached path reads it back: rounded to the cache's dtype, then q's.
            kf = k_tok.to(q.dtype).to(tl.float32)
            s_new = tl.sum(q.to(tl.float32) * kf[None, :], axis=1) * scale_log2  # (G,)
            m_new = tl.maximum(m_i, s_new)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s_new - m_new)
            l_i = l_i * alpha + p
            vf = v_tok.to(q.dtype).to(tl.float32)
            acc = acc * alpha[:, None] + p.to(q.dtype).to(tl.float32)[:, None] * vf[None, :]
            m_i = m_new
    out = _scaled_by_v(acc / tl.where(l_i > 0, l_i, 1.0)[:, None], v_cache_ptr, v_scale)  # an empty split: zeros
    omask = gmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + row64 * stride_o_t + heads[:, None] * stride_o_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        part = (row64 * num_heads + heads) * NUM_SPLITS + split  # (G,)
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM_P2 + d[None, :], out, mask=omask)
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_i), mask=gmask)  # -inf when empty
    trace_stamp(trace_ptr, program, T_EXIT, TRACE)


@triton.jit
def _combine_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_heads, stride_o_t, stride_o_h,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM_P2)
    part = (row * num_heads + h) * NUM_SPLITS + s
    lse = tl.load(part_lse_ptr + part)
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # empty splits weigh 0
    o = tl.load(part_out_ptr + part[:, None] * HEAD_DIM_P2 + d[None, :])
    denom = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + row * stride_o_t + h * stride_o_h + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


@triton.jit
def _attend_tile(q, acc, l_i, m_i, q_pos, n0, kv_end, k_cache_ptr, v_cache_ptr, bt_row, d, dmask,
                 kvh, scale_log2, stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok,
                 stride_v_h, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, CAUSAL_MASK: tl.constexpr):
    """One online-softmax step of the prefill kernel over keys [n0, n0 + BLOCK_N)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < kv_end
    k, v = _load_kv_tiles(k_cache_ptr, v_cache_ptr, bt_row, offs_n, mask_n, d, dmask, kvh, stride_k_blk,
                          stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE)
    visible = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]
    return _online_softmax_step(q, k, v, visible, acc, l_i, m_i, scale_log2, DOT_PRECISION, CAUSAL_MASK)


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr,
                    scale_log2, v_scale, num_seqs,
                    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_bt,
                    stride_k_blk, stride_k_tok, stride_k_h, stride_v_blk, stride_v_tok, stride_v_h,
                    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HEAD_DIM_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_N: tl.constexpr, SEQS_BLOCK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P2
    qb = tl.program_id(0)
    kvh = tl.program_id(1)
    b = _find_sequence(qsl_ptr, num_seqs, qb, BLOCK_Q, SEQS_BLOCK)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    j = qb - (q_start // BLOCK_Q + b)  # this program's query block within sequence b
    if j * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx_len = seq_len - q_len

    m = tl.arange(0, BLOCK_M)
    tok = j * BLOCK_Q + m // GROUP_P2  # query token within the chunk, (M,)
    g = m % GROUP_P2
    d = tl.arange(0, HEAD_DIM_P2)
    dmask = d < HEAD_DIM
    row_mask = (tok < q_len) & (g < GROUP)
    heads = kvh * GROUP + g
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_q_t + heads[:, None] * stride_q_h + d[None, :],
                mask=row_mask[:, None] & dmask[None, :], other=0.0)  # (M, D)
    q = _dot_dtype_for_cache(q, k_cache_ptr)
    q_pos = ctx_len + tok
    kv_end = tl.minimum(seq_len, ctx_len + tl.minimum((j + 1) * BLOCK_Q, q_len))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    # Keys before the block's first query position are visible to all its rows: no causal mask.
    unmasked_end = (ctx_len + j * BLOCK_Q) // BLOCK_N * BLOCK_N
    for n0 in range(0, unmasked_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, q_pos, n0, kv_end, k_cache_ptr, v_cache_ptr,
                                     bt_row, d, dmask, kvh, scale_log2, stride_k_blk, stride_k_tok,
                                     stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE,
                                     BLOCK_N, DOT_PRECISION, False)
    for n0 in range(unmasked_end, kv_end, BLOCK_N):  # the diagonal: one or two tiles
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, q_pos, n0, kv_end, k_cache_ptr, v_cache_ptr,
                                     bt_row, d, dmask, kvh, scale_log2, stride_k_blk, stride_k_tok,
                                     stride_k_h, stride_v_blk, stride_v_tok, stride_v_h, BLOCK_SIZE,
                                     BLOCK_N, DOT_PRECISION, True)
    out = _scaled_by_v(acc / tl.where(l_i > 0, l_i, 1.0)[:, None], v_cache_ptr, v_scale)
    tl.store(out_ptr + rows[:, None] * stride_o_t + heads[:, None] * stride_o_h + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dmask[None, :])


# Two stages. Alone, the kernel ran faster with three (H200, batch 64, `kernels_bench.py --only decode
# --sweep --decode-shapes 64x192,64x256`, 2026-11-30: 17.4 / 22.0 us at context 192 / 256 against
# 19.2 / 24.0), but in the engine's step three cost 0.15-0.19 ms at batch 64 and 0.06 at batch 16
# (`decode_bench.py --attention-configs`, docs/benchmarks.md): time tiles in the step, not alone.
# EARLY_KV (an A/B key, off): the first cached K/V tile read into registers before the PDL wait,
# in fused decode steps only. It lost too (batch 64 +0.15-0.23 ms; +0.08-0.15 with maxnreg 128, as
# its 31 more registers a thread leave three programs a multiprocessor instead of four;
# docs/benchmarks-history.md 2026-11-30 k).
# OPAQUE_BT (an A/B key, off): block ids read by inline PTX, so that num_stages really pipelines the
# K/V tiles (see _tile_blocks). Alone it gained (batch 64, context 192: 17.3 against 18.8 us at this
# tile), in the step nothing (batch 64 4.806 against 4.800 ms over four alternated rounds, 32 rows
# -0.05 ms in one call and +0.003 in the next; docs/benchmarks-history.md 2026-11-30 l).
DECODE_CONFIG = dict(BLOCK_N=64, num_warps=4, num_stages=2)
# 2-16 rows: half the tile, no pipelining (H200, session h: batch 16 4.647-4.671 ms a step against
# 4.741-4.776 over four alternated runs). Batch 1 lost (3.79-3.82 against 3.75), 64 rows lost
# (4.943 / 5.091 against 4.731 / 4.888) and 32 gained nothing (5.492 / 5.405 against 5.234 / 5.421):
# benchmarks/results/ab-attention-*-2026-11-30h.txt.
SMALL_BATCH_ROWS = 16
# LATE: the kernel after it (o) launches once every program has left its loop. With o's and
# gate/up's 16-row table entries late too, batch 16 took 4.542 against 4.562 ms, every one of four
# alternated rounds; any one of the three alone moved nothing (pdl-trigger-ab-h200-2026-12-01u.txt).
SMALL_BATCH_DECODE_CONFIG = dict(BLOCK_N=32, num_warps=4, num_stages=1, LATE=True)
# Heads wider than WIDE_HEAD_ABOVE (GPT-J's 256) above one row: the default tile's bytes at half
# its tokens, pipelined at every row count, and rotary in its own kernel ahead (FUSE_ROTARY False:
# rotary_decode_attention reads it), because fused the kernel holds 154 registers a thread and
# keeps three programs a multiprocessor, unfused 123 and four (benchmarks/attention_resources.py).
# H200, GPT-J-6B, context 192, alone (`kernels_bench.py --only decode --sweep --heads gptj-6b`,
# 2026-11-30 n): 64 rows 73.2 us fused at the default tile, 70.6 fused at this one, 56.5 + the
# rotary kernel's ~4.7 unfused. In the step, alternated: batch 64 5.48 -> 4.96 ms, batch 16 4.20 ->
# 3.98; fused at this tile 5.36 and 4.04, fused with maxnreg 128 (four a multiprocessor) 5.24 and
# 4.00 (docs/benchmarks.md, GPT-J's attention).
WIDE_HEAD_ABOVE = 128
WIDE_HEAD_DECODE_CONFIG = dict(BLOCK_N=32, num_warps=4, num_stages=2, FUSE_ROTARY=False)
# An e4m3 cache (heads up to 128 wide), by the longest context the step may hold: up to
# FP8_SHORT_CONTEXT tokens a tile of 32, above it one of 128 (the bf16 default's bytes at twice its
# tokens). H200, the fused step alone (`kernels_bench --only decode-fp8 --sweep --decode-shapes
# 64x1024,16x2048,64x192,1x2048`, 2026-12-01 w3, us; over a bf16 cache at its own tile in brackets):
# 64 rows of 192 tokens 18.8 at 32 against 21.5 at 128 (19.6); 64 of 1,024 63.1 against 77.6 at 32
# (76.5); 16 of 2,048 42.3 against 48.2 (56.7); 1 of 2,048 9.6-9.7 at either (9.9).
FP8_SHORT_CONTEXT = 256
FP8_DECODE_CONFIG = dict(BLOCK_N=128, num_warps=4, num_stages=2)
FP8_SHORT_DECODE_CONFIG = dict(BLOCK_N=32, num_warps=4, num_stages=2)
# Keys a benchmark changes on top of decode_config_for's choice, at every row count (an A/B switch:
# decode_bench --attention-configs, step_tune --attention).
DECODE_OVERRIDE: dict = {}


def decode_config_for(rows: int, head_dim: int = 128, cache_dtype: torch.dtype | None = None,
                      max_context: int | None = None) -> dict:
    """The decode kernel's BLOCK_N, num_warps and num_stages for a step of `rows` query rows of
    heads `head_dim` wide over a cache of `cache_dtype` (default: as wide as bf16) whose rows hold
    at most `max_context` tokens (default: long), and FUSE_ROTARY where rotary should not fuse into it."""
    if rows > 1 and head_dim > WIDE_HEAD_ABOVE:
        base = WIDE_HEAD_DECODE_CONFIG
    elif cache_dtype is not None and cache_dtype.itemsize == 1:
        short = max_context is not None and max_context <= FP8_SHORT_CONTEXT
        base = FP8_SHORT_DECODE_CONFIG if short else FP8_DECODE_CONFIG
    else:
        base = SMALL_BATCH_DECODE_CONFIG if 1 < rows <= SMALL_BATCH_ROWS else DECODE_CONFIG
    return dict(base, **DECODE_OVERRIDE)


def max_context(max_seq_len: int | None, block_tables: torch.Tensor, block_size: int) -> int:
    """The longest context a decode step may hold: the caller's hint, else the table's width."""
    return max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size


def _num_splits(num_programs: int, max_ctx: int, num_sms: int, min_tokens: int = 64) -> int:
    """Context splits per (row, kv head): enough programs to fill the GPU twice over, while each
    split still holds min_tokens of the longest possible context. A power of two, at most 64."""
    splits = 1
    while (num_programs * splits < 2 * num_sms and splits < 64
           and max_ctx >= 2 * splits * min_tokens):
        splits *= 2
    return splits


def _cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    assert cache.stride(-1) == 1, "the KV cache's head_dim must be contiguous"
    return cache.stride(0), cache.stride(1), cache.stride(2)


def paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, *,
                           max_query_len: int | None = None, max_seq_len: int | None = None,
                           decode_config: dict | None = None, prefill_config: dict | None = None,
                           num_splits: int | None = None, rotary: tuple | None = None,
                           kv_scales: KVScales = NO_SCALES):
    """`decode_config`: BLOCK_N, num_warps, num_stages (and maxnreg, EARLY_KV, OPAQUE_BT, LATE, NEW_FIRST) of the decode
    kernel (decode_config_for's by default); its context splits are `num_splits`, else the config's
    `splits` (how an A/B forces them), else `_num_splits`'s choice. `rotary`: (k, v, positions,
    cos_sin, rotary_dim, slot_mapping) of a decode step whose q, k and v are unrotated and not yet
    cached (see _decode_kernel); it requires max_query_len == 1. `kv_scales`: an fp8 cache's
    (the k scale goes into the scores' scale, the v scale onto the output)."""
    T, nh, hd = q.shape
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    B = block_tables.shape[0]
    group = nh // nkv
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty((T, nh, hd), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    common = dict(HEAD_DIM=hd, HEAD_DIM_P2=max(next_pow2(hd), 16), BLOCK_SIZE=block_size,
                  SEQS_BLOCK=64, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    strides = (q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
               *_cache_strides(k_cache), *_cache_strides(v_cache))
    k_scale, v_scale = kv_scales if is_fp8(k_cache.dtype) else NO_SCALES
    scale_log2 = scale * k_scale * _LOG2E
    is_decode = max_query_len == 1 if max_query_len is not None else T == B
    assert rotary is None or max_query_len == 1, "rotary fused into attention needs one query row per sequence"
    if is_decode:
        max_ctx = max_context(max_seq_len, block_tables, block_size)
        cfg = dict(decode_config or decode_config_for(T, hd, k_cache.dtype, max_ctx))
        cfg.pop("FUSE_ROTARY", None)  # rotary_decode_attention's choice, made before this call
        splits = num_splits or cfg.pop("splits", None) or _num_splits(T * nkv, max_ctx, sm_count(q))
        if not 1 <= splits <= 64 or splits & (splits - 1):
            raise ValueError(f"decode attention splits={splits}: a power of two from 1 to 64")
        one_row = max_query_len == 1 and T == B  # a decode step: row r is sequence r
        # Early K/V reads are safe only where an earlier step wrote every cached key: a fused decode step.
        early_kv = cfg.pop("EARLY_KV", False) and one_row and rotary is not None
        opaque_bt = cfg.pop("OPAQUE_BT", False) and not _dispatch.TRITON_INTERPRET  # the interpreter runs no PTX
        late = bool(cfg.pop("LATE", False))
        new_first = bool(cfg.pop("NEW_FIRST", False)) and rotary is not None
        hd_p2 = common["HEAD_DIM_P2"]
        if splits > 1:
            part_out = torch.empty((T, nh, splits, hd_p2), dtype=torch.float32, device=q.device)
            part_lse = torch.empty((T, nh, splits), dtype=torch.float32, device=q.device)
        else:
            part_out = part_lse = out  # unused
        if rotary is not None:
            k, v, positions, cos_sin, rotary_dim, slot_mapping = rotary
            assert k.stride(-1) == 1 and v.stride(-1) == 1 and cos_sin.stride(-1) == 1
            new_kv = (k, v, positions, cos_sin, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                      cos_sin.stride(0), inverse(k_scale), inverse(v_scale))
            rot = dict(ROTARY=True, HALF=rotary_dim // 2, ROT=rotary_dim)
        else:
            new_kv = (q, q, seq_lens, q, seq_lens, 0, 0, 0, 0, 0, 1.0, 1.0)  # unused
            rot = dict(ROTARY=False, HALF=1, ROT=2)
        trace_ptr, traced = trace.buffer("attention", T * nkv * splits, out)
        _decode_kernel[(T, nkv, splits)](
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_lse,
            scale_log2, v_scale, B, nh, *strides, *new_kv, trace_ptr, TRACE=traced, GROUP=group,
            GROUP_P2=max(next_pow2(group), 16),
            NUM_SPLITS=splits, **rot, ONE_ROW=one_row, EARLY_KV=early_kv, OPAQUE_BT=opaque_bt, LATE=late, NEW_FIRST=new_first,
            **cfg,
            **common, **pdl_args(q))
        if splits > 1:
            _combine_kernel[(T, nh)](part_out, part_lse, out, nh, out.stride(0), out.stride(1),
                                     HEAD_DIM=hd, HEAD_DIM_P2=hd_p2, NUM_SPLITS=splits, num_warps=4,
                                     **pdl_args(q))
        return out
    cfg = prefill_config or _prefill_config(T, hd, group)
    block_q = max(cfg["BLOCK_M"] // next_pow2(group), 1)
    grid = (triton.cdiv(T, block_q) + B, nkv)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale_log2, v_scale, B, *strides,
        GROUP=group, GROUP_P2=next_pow2(group), BLOCK_Q=block_q, BLOCK_N=cfg["BLOCK_N"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **common)
    return out


def _prefill_config(T: int, hd: int, group: int) -> dict:
    if hd > 128:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)
    # H200, hd 128, 2048-token causal chunk: 144 us against 154 for BLOCK_M=128 (8 warps).
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
