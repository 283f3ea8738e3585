"""The 12-bit weight form's decode GEMM for 1..64 rows (Hopper, Gluon): y = x @ W.T [-> silu(gate) * up].

W arrives as exp12.py's planes (0.75 of bf16's bytes) and is rebuilt in registers, straight into
the wgmma's A operand: the product runs the other way round from the ring GEMM's (gluon_ring.py),
acc [128 weight rows, 64 x rows] = W_tile @ x_tile.T, because Hopper's wgmma reads only its A
operand from registers. Each thread's share of a 64-column block is one 16-byte load of the B
plane and one 8-byte load of the N plane a row, and 8 weights come out of 9 instructions (two
masks, a rotate, an add, four byte permutes; exp12.decode_words emulates them); the reshapes and
permutes that put them in the operand's order relabel registers (convert_layout checks that they
move no data). The next stage is rebuilt while the wgmma of this one runs.

Three partitions (warp specialization):
- the consumers (8 warps, two warpgroups of 64 weight rows): rebuild and multiply, then add the
  corrections' product and hand the sums to the epilogue;
- a producer warp: streams the planes (before the PDL wait: no kernel writes them) and x's tiles
  (after it) into a shared-memory ring by TMA;
- a corrections warp: the weights below the exponent window (exp12.py) are rebuilt as the window's
  floor, so each tile's list of them becomes A_c [128, 2E] (a row's true value in column e, -floor
  in column E + e, zeros elsewhere) and x's listed columns G [64, 2E] (column e and E + e: x's
  column of entry e), both in shared memory; the consumers' one extra wgmma adds A_c @ G.T, so
  the product is the bf16 weight's, bit for bit in the weights (the sums' order is the kernel's).

The epilogue is the ring's (gluon_ring.finish: the RMSNorm fold's row factors, bias, SwiGLU, the
residual add and its sums of squares, the store): with GLU a tile's 16-row slabs are 8 gate rows
and the 8 up rows below them (exp12.row_order), so each thread holds gate and up of the same
outputs. A product of few tiles (Llama-3-8B's o and down: 32) splits K (SPLIT_K): each split
corrects the listed weights in its own columns, and the tile's last split to finish sums the
fp32 partials and runs the epilogue, as the ring's split-K does. One launch and no host
synchronisation: safe to capture in a CUDA graph.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .exp12 import BLOCK, MASK, TILE_ROWS, Exp12Weight
from .gluon_ring import (_gdc_launch_dependents, _gdc_wait, _out_layout, finish, fold_factors, fold_loads,
                         split_k_arrive, split_k_sum)

ROWS = gl.constexpr(64)  # x's rows: the wgmma's N, whatever M <= 64 is
BW = gl.constexpr(TILE_ROWS)  # stored weight rows a program: 8 warps of 16
LIST_BLOCK = gl.constexpr(BLOCK)  # the columns of a block whose list entries `start` locates
WARPS = 8

_DECODE = gl.constexpr("""{
.reg .b32 hi, rot, pair;
and.b32 hi, $10, 0x87878787;
add.u32 hi, hi, $11;
shf.r.wrap.b32 rot, $10, $10, 4;
and.b32 rot, rot, 0x87878787;
add.u32 rot, rot, $11;
prmt.b32 pair, $8, hi, 0x5140;
mov.b32 {$0, $1}, pair;
prmt.b32 pair, $8, hi, 0x7362;
mov.b32 {$2, $3}, pair;
prmt.b32 pair, $9, rot, 0x5140;
mov.b32 {$4, $5}, pair;
prmt.b32 pair, $9, rot, 0x7362;
mov.b32 {$6, $7}, pair;
}""")
assert f"{MASK:#x}" in _DECODE.value


@gluon.constexpr_function
def plane_layout(words_per_block, num_warps, width):
    """A thread's words of a plane tile [16 * num_warps, width] int32: the B plane's 4 (16 bytes) or
    the N plane's 2 (8 bytes) a 64-column block, for its two rows (r, r + 8), as the wgmma's A
    fragment places rows: lanes % 4 across a block's words, lanes / 4 down the rows, warps 16
    rows each."""
    words_per_block, num_warps, width = (int(getattr(v, "value", v)) for v in (words_per_block, num_warps, width))
    per_thread = words_per_block // 4
    reg = [[0, 1 << b] for b in range(per_thread.bit_length() - 1)] + [[8, 0]]
    reg += [[0, words_per_block << b] for b in range((width // words_per_block).bit_length() - 1)]
    lane = [[0, per_thread], [0, 2 * per_thread], [1, 0], [2, 0], [4, 0]]
    warp = [[16 << w, 0] for w in range(num_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=lane, warp_bases=warp, block_bases=[],
                                      shape=[16 * num_warps, width])


@gluon.constexpr_function
def acc_layout(num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[int(getattr(num_warps, "value", num_warps)), 1],
                                     instr_shape=[16, 64, 16])


@gluon.jit
def decode_group(b_lo, b_hi, n_word, add):
    """The 8 bf16 weights of each group (two B words, one N word; `add`: base / 2 in every byte)."""
    return gl.inline_asm_elementwise(_DECODE, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [b_lo, b_hi, n_word, add],
                                     dtype=[gl.bfloat16] * 8, is_pure=True, pack=1)


@gluon.jit
def rebuild(b_tile, n_tile, add, BLOCK_K: gl.constexpr, num_warps: gl.constexpr):
    """The A operand [16 * num_warps, BLOCK_K] bf16 from a stage's planes in shared memory."""
    RW: gl.constexpr = 16 * num_warps
    G: gl.constexpr = BLOCK_K // 8
    n_layout: gl.constexpr = plane_layout(8, num_warps, G)
    b = b_tile.load(plane_layout(16, num_warps, BLOCK_K // 4))
    nw = n_tile.load(n_layout)
    b_lo, b_hi = gl.split(gl.reshape(b, [RW, G, 2]))
    b_lo = gl.convert_layout(b_lo, n_layout, assert_trivial=True)
    b_hi = gl.convert_layout(b_hi, n_layout, assert_trivial=True)
    adds = gl.full([RW, G], add, gl.int32, layout=n_layout)
    o0, o1, o2, o3, o4, o5, o6, o7 = decode_group(b_lo, b_hi, nw, adds)
    q0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
    q1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
    w = gl.join(q0, q1)  # [RW, G, i0, i1, i2]
    w = gl.reshape(w, [RW, BLOCK_K // 64, 2, 2, 2, 2, 2, 2])  # g as (block, g2, g1, g0)
    w = gl.permute(w, (0, 1, 4, 7, 6, 2, 3, 5))  # column bits k5..k0 = g0, i2, i1, g2, g1, i0
    w = gl.reshape(w, [RW, BLOCK_K])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout(num_warps), k_width=2)
    return gl.convert_layout(w, a_layout, assert_trivial=True)


@gluon.jit
def _request_planes(b_desc, n_desc, b_ring, n_ring, bar, slot, row, k, nbytes: gl.constexpr, pred):
    """Arm `bar` for a stage's `nbytes` (x's tile included) and request its planes."""
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(b_desc, [row, k // 4], bar, b_ring.index(slot), pred=pred)
    tma.async_copy_global_to_shared(n_desc, [row, k // 8], bar, n_ring.index(slot), pred=pred)


@gluon.jit
def _producer(x_desc, b_desc, n_desc, x_ring, b_ring, n_ring, ready, empty, row, k_lo, k_tiles, STAGES: gl.constexpr,
              EARLY: gl.constexpr, USE_PDL: gl.constexpr):
    """One warp: a stage's `ready` completes when its x tile and planes have landed, its `empty`
    when the consumers are done with it. The first EARLY stages' planes go before the PDL wait.
    The split's K tiles start at column k_lo."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    nbytes: gl.constexpr = x_desc.block_type.nbytes + b_desc.block_type.nbytes + n_desc.block_type.nbytes
    for s in gl.static_range(EARLY):
        _request_planes(b_desc, n_desc, b_ring, n_ring, ready.index(s), s, row, k_lo + s * BLOCK_K, nbytes,
                        s < k_tiles)
    if USE_PDL:
        _gdc_wait()
    for i in range(k_tiles):
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), (i // STAGES - 1) & 1)
        if i >= EARLY:
            _request_planes(b_desc, n_desc, b_ring, n_ring, ready.index(slot), slot, row, k_lo + i * BLOCK_K, nbytes,
                            True)
        tma.async_copy_global_to_shared(x_desc, [0, k_lo + i * BLOCK_K], ready.index(slot), x_ring.index(slot))


@gluon.jit
def _corrections(x_ptr, stride_xm, M, rows_ptr, cols_ptr, vals_ptr, start_ptr, L, K, neg_floor, a_smem, g_smem,
                 corr_ready, tile, k_lo, k_hi, E: gl.constexpr, USE_PDL: gl.constexpr):
    """One warp: A_c [BW, 2E] (before the PDL wait: the list is the weight's) and G [64, 2E] (x's
    listed columns, after it) into shared memory, then `corr_ready`. A tile's list is sorted by
    column and `start` says where each 64-column block's entries begin, so this split takes the
    entries of its own columns [k_lo, k_hi) (at most E: the host checked); the rest of its 2E
    columns have row -1, which no row of A_c matches."""
    C: gl.constexpr = 2 * E
    layout: gl.constexpr = gl.BlockedLayout([1, C // 32], [1, 32], [1, 1], [1, 0])
    cols = gl.arange(0, C, layout=gl.SliceLayout(0, layout))
    starts = start_ptr + tile * (K // LIST_BLOCK + 1)
    idx = gl.load(starts + k_lo // LIST_BLOCK) + cols % E
    ok = idx < gl.load(starts + gl.minimum(k_hi, K) // LIST_BLOCK)
    e = tile * L + idx
    r_e = gl.load(rows_ptr + e, mask=ok, other=-1)
    k_e = gl.load(cols_ptr + e, mask=ok, other=0)
    v = gl.where(cols < E, gl.load(vals_ptr + e, mask=ok, other=0.0).to(gl.float32), neg_floor)
    for r0 in gl.static_range(0, BW, 16):
        r = r0 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
        a = gl.where(r[:, None] == r_e[None, :], v[None, :], 0.0)
        a_smem.slice(r0, 16).store(a.to(gl.bfloat16))
    if USE_PDL:
        _gdc_wait()
    for m0 in gl.static_range(0, ROWS, 16):
        m = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
        g = gl.load(x_ptr + m[:, None] * stride_xm + k_e[None, :], mask=(m < M)[:, None], other=0.0)
        g_smem.slice(m0, 16).store(g)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(corr_ready)


@gluon.jit
def _consumer(x_ring, b_ring, n_ring, a_smem, g_smem, ready, empty, corr_ready, k_tiles, add, ss_in_ptr, ss_parts,
              eps, M, K, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, ROW_NORM: gl.constexpr,
              PARTS_P2: gl.constexpr, USE_PDL: gl.constexpr, LATE: gl.constexpr, num_warps: gl.constexpr):
    """acc [BW stored rows, 64 x rows] over K, plus the corrections' product; with the fold each x
    row's 1 / rms (its partial sums requested right after the PDL wait)."""
    if USE_PDL:
        _gdc_wait()
        if not LATE:
            _gdc_launch_dependents()
    ss, sums = fold_loads(ss_in_ptr, ss_parts, M, ROW_NORM, False, PARTS_P2, num_warps)
    acc = gl.zeros((BW, ROWS), dtype=gl.float32, layout=acc_layout(num_warps))
    mbarrier.wait(ready.index(0), 0)
    a = rebuild(b_ring.index(0), n_ring.index(0), add, BLOCK_K, num_warps)
    for i in range(k_tiles):
        slot = i % STAGES
        acc = warpgroup_mma(a, x_ring.index(slot).permute((1, 0)), acc, is_async=True)
        if i + 1 < k_tiles:
            nxt = (i + 1) % STAGES
            mbarrier.wait(ready.index(nxt), ((i + 1) // STAGES) & 1)
            a = rebuild(b_ring.index(nxt), n_ring.index(nxt), add, BLOCK_K, num_warps)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(slot))
    if USE_PDL:
        if LATE:
            _gdc_launch_dependents()
    mbarrier.wait(corr_ready, 0)
    acc = warpgroup_mma(a_smem, g_smem.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    rstd, mean = fold_factors(ss, sums, K, eps, ROW_NORM, False, num_warps)
    return acc, rstd


@gluon.jit
def _exp12_linear_kernel(x_desc, b_desc, n_desc, x_ptr, stride_xm, rows_ptr, cols_ptr, vals_ptr, start_ptr, L,
                         neg_floor, add, bias_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_om, ss_in_ptr,
                         ss_parts, eps, res_ptr, stride_res, ss_out_ptr, E: gl.constexpr, HAS_BIAS: gl.constexpr,
                         GLU: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr, EARLY: gl.constexpr,
                         ROW_NORM: gl.constexpr, PARTS_P2: gl.constexpr, RESIDUAL: gl.constexpr, USE_PDL: gl.constexpr,
                         LATE: gl.constexpr, num_warps: gl.constexpr):
    """out [M, N] for stored tile pid (BW rows: with GLU 64 gate and 64 up rows, N the gate rows),
    over K split SPLIT_K ways in whole BLOCK_K tiles (the host gives every split at least one);
    RESIDUAL: out = residual + the product, and each row's partial sum of squares at ss_out."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    row = pid * BW
    k_tiles_all = gl.cdiv(K, BLOCK_K)
    per_split = gl.cdiv(k_tiles_all, SPLIT_K)
    k_lo = pid_k * per_split * BLOCK_K
    k_tiles = gl.minimum(per_split, k_tiles_all - pid_k * per_split)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, ROWS, BLOCK_K], x_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BW, BLOCK_K // 4], b_desc.layout)
    n_ring = gl.allocate_shared_memory(n_desc.dtype, [STAGES, BW, BLOCK_K // 8], n_desc.layout)
    a_smem = gl.allocate_shared_memory(gl.bfloat16, [BW, 2 * E],
                                       gl.NVMMASharedLayout.get_default_for([BW, 2 * E], gl.bfloat16))
    g_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, 2 * E],
                                       gl.NVMMASharedLayout.get_default_for([ROWS, 2 * E], gl.bfloat16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    corr_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(corr_ready, count=1)
    acc, rstd = gl.warp_specialize(
        [(_consumer, (x_ring, b_ring, n_ring, a_smem, g_smem, ready, empty, corr_ready, k_tiles, add, ss_in_ptr,
                      ss_parts, eps, M, K, BLOCK_K, STAGES, ROW_NORM, PARTS_P2, USE_PDL, LATE, num_warps)),
         (_producer, (x_desc, b_desc, n_desc, x_ring, b_ring, n_ring, ready, empty, row, k_lo, k_tiles, STAGES,
                      EARLY, USE_PDL)),
         (_corrections, (x_ptr, stride_xm, M, rows_ptr, cols_ptr, vals_ptr, start_ptr, L, K, neg_floor, a_smem,
                         g_smem, corr_ready, pid, k_lo, k_lo + k_tiles * BLOCK_K, E, USE_PDL))],
        [1, 1], [40, 128])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    mbarrier.invalidate(corr_ready)

    out_layout: gl.constexpr = _out_layout(num_warps)
    if GLU:  # a slab's rows 0-7 are gate rows, 8-15 the same outputs' up rows: a register bit apart
        BN: gl.constexpr = BW // 2
        pair = gl.permute(gl.reshape(acc, [BW // 16, 2, 8, ROWS]), (0, 2, 3, 1))
        gate, up = gl.split(gl.reshape(pair, [BN, ROWS, 2]))
        acc = gl.convert_layout(gl.permute(gate, (1, 0)), out_layout)
        acc_up = gl.convert_layout(gl.permute(up, (1, 0)), out_layout)
    else:
        BN: gl.constexpr = BW
        acc = gl.convert_layout(gl.permute(acc, (1, 0)), out_layout)
        acc_up = acc
    offs_m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, out_layout))
    offs_n = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, out_layout))
    n_mask = offs_n < N
    mask = (offs_m[:, None] < M) & n_mask[None, :]
    if SPLIT_K > 1:  # the tile's last split to arrive sums the fp32 partials and runs the epilogue
        if not split_k_arrive(acc, acc_up, part_ptr, count_ptr, pid, pid_k, offs_m, offs_n, mask, M, N, SPLIT_K, GLU):
            return
        acc, acc_up = split_k_sum(part_ptr, count_ptr, pid, offs_m, offs_n, mask, M, N, SPLIT_K, GLU, True, num_warps)
    res = acc  # a placeholder unless RESIDUAL
    if RESIDUAL:
        res = gl.load(res_ptr + offs_m[:, None] * stride_res + offs_n[None, :], mask=mask, other=0.0).to(gl.float32)
    finish(acc, acc_up, rstd, res, rstd, offs_m, offs_n, n_mask, mask, bias_ptr, bias_ptr, out_ptr, stride_om,
           ss_out_ptr, pid, M, N, HAS_BIAS, GLU, ROW_NORM, RESIDUAL, False, False)


def smem_layouts(block_k: int) -> tuple:
    """(x's, the B plane's, the N plane's) shared layouts for a BLOCK_K tile (the planes as int32 words)."""
    return (gl.NVMMASharedLayout.get_default_for([64, block_k], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([TILE_ROWS, block_k // 4], gl.int32),
            gl.NVMMASharedLayout.get_default_for([TILE_ROWS, block_k // 8], gl.int32))


def exp12_linear_gluon(x: torch.Tensor, w: Exp12Weight, bias: torch.Tensor | None, cfg: dict, norm=None,
                       residual: torch.Tensor | None = None):
    """y [.., N] for x [.., K] (bf16, at most 64 rows) and the 12-bit form of a [N, K] weight (with
    w.glu the fused [gate; up] projection, y [.., N / 2] = silu(gate) * up); `cfg`:
    exp12.exp12_config's validated config (quant.exp12_linear checks its SPLIT_K against K);
    `norm` and `residual`: the fold, as small_m_linear's (with `residual` the result is (stream,
    its partial sums of squares [tiles, M]))."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ._dispatch import use_pdl
    from .triton_quant import FoldArgs, _tile_counters
    rows, K = w.shape
    N = rows // 2 if w.glu else rows
    tiles = rows // TILE_ROWS
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1 or x2.data_ptr() % 16 or (x2.stride(0) * x2.element_size()) % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # TMA's rules; a fresh allocation is aligned
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out.view(*x.shape[:-1], N) if residual is None else (out, out.new_zeros((1, M), dtype=torch.float32))
    block_k, stages, split_k = cfg["BLOCK_K"], cfg["STAGES"], cfg["SPLIT_K"]
    x_l, b_l, n_l = smem_layouts(block_k)
    x_desc = TensorDescriptor.from_tensor(x2, [64, block_k], x_l)
    b_desc = TensorDescriptor.from_tensor(w.b_plane.view(torch.int32), [TILE_ROWS, block_k // 4], b_l)
    n_desc = TensorDescriptor.from_tensor(w.n_plane.view(torch.int32), [TILE_ROWS, block_k // 8], n_l)
    fold = FoldArgs(out, tiles, M, norm, residual)
    ss_in, parts, eps, res, stride_res, ss_out, _ = fold.args
    if split_k > 1:
        part = torch.empty((split_k, 2 if w.glu else 1, M, N), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, tiles)
    else:
        part, counters = out, out  # unused
    pdl = use_pdl(x2)
    _exp12_linear_kernel[(tiles, split_k)](
        x_desc, b_desc, n_desc, x2, x2.stride(0), w.corr_rows, w.corr_cols, w.corr_vals, w.corr_start, w.entries,
        -w.floor, (w.base // 2) * 0x01010101, bias if bias is not None else out, out, part, counters, M, N, K,
        out.stride(0), ss_in, parts, eps, res, stride_res, ss_out,
        E=w.split_entries(block_k, split_k), HAS_BIAS=bias is not None, GLU=w.glu, SPLIT_K=split_k, STAGES=stages,
        EARLY=min(cfg.get("EARLY", stages), stages), ROW_NORM=norm is not None, PARTS_P2=fold.parts_p2,
        RESIDUAL=residual is not None, USE_PDL=pdl, LATE=bool(cfg.get("LATE", 0)), num_warps=WARPS, launch_pdl=pdl)
    if residual is not None:
        return out, fold.partials
    return out.view(*x.shape[:-1], N)


def compile_for_sm90(glu: bool = True, row_norm: bool = True, block_k: int = 128, stages: int = 4, entries: int = 64,
                     bias: bool = False, split_k: int = 1, residual: bool = False):
    """The kernel as exp12_linear_gluon launches it at 64 rows, compiled for sm_90 on any machine
    (no GPU): for tests and for reading its registers, spills and shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    order = list(_exp12_linear_kernel.arg_names)
    x_l, b_l, n_l = smem_layouts(block_k)
    sig = {"x_desc": f"tensordesc<bf16[64, {block_k}],{x_l!r}>",
           "b_desc": f"tensordesc<i32[{TILE_ROWS}, {block_k // 4}],{b_l!r}>",
           "n_desc": f"tensordesc<i32[{TILE_ROWS}, {block_k // 8}],{n_l!r}>",
           "x_ptr": "*bf16", "rows_ptr": "*i32", "cols_ptr": "*i32", "vals_ptr": "*bf16", "start_ptr": "*i32",
           "neg_floor": "fp32",
           "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "ss_in_ptr": "*fp32",
           "eps": "fp32", "res_ptr": "*bf16", "ss_out_ptr": "*fp32"}
    sig |= {n: "i32" for n in ("stride_xm", "L", "add", "M", "N", "K", "stride_om", "ss_parts", "stride_res")}
    constexprs = dict(E=entries, HAS_BIAS=bias, GLU=glu, SPLIT_K=split_k, STAGES=stages, EARLY=stages,
                      ROW_NORM=row_norm, PARTS_P2=32, RESIDUAL=residual, USE_PDL=True, LATE=False, num_warps=WARPS)
    sig |= {k: "constexpr" for k in constexprs}
    src = GluonASTSource(fn=_exp12_linear_kernel, signature={n: sig[n] for n in order},
                         constexprs={(order.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS})
