"""The 12-bit weight form rebuilt straight into the wgmma operand's registers, in Gluon. A probe.

    python -m benchmarks.exponent_code_wgmma [--shapes gate/up,down,qkv,o] [--quick]

benchmarks/exponent_code_probe.py asked whether batch-64 decode could read 0.75 of the bytes of
its bf16 weights (a sign-and-mantissa byte and a 4-bit exponent code a weight) and found that in
plain Triton rebuilding cost 2-2.7x the bf16 form's time: the tile built in registers takes a
trip through shared memory into the MMA's operand, and each weight pays its own integer work.
What it left to try is this kernel: the weight as the wgmma's A operand, which Hopper reads from
registers, each thread rebuilding exactly its own fragment with a few whole-word instructions.

**The form** (pack): a weight of exponent E in a matrix's window [base, base + 15] (base even;
the matrix's top exponents) is E - base = c, 4 bits, and is stored as

- a byte of the B plane, [N, K] uint8: c's lowest bit, then the 7 mantissa bits;
- half a byte of the N plane, [N, K / 2] uint8: its sign and c's upper 3 bits.

Weights below the window (zeros, the tiniest magnitudes; 0.015% at std 0.02) are stored as the
window's smallest value and need a sparse correction in a real path; here the check compares
with what the kernel multiplies (unpack).

**Where each bit goes.** In the A operand of a wgmma over a 64-column block, a thread holds, for
each of its two rows, the 16 columns k whose bits 1 and 2 are its lane's (lane % 4). So each
64-column block is stored permuted: position j = 8 g + i holds column k with bits (k0, k3, k4) =
i's and (k5, k1, k2) = g's, and a thread's 16 columns are 16 contiguous bytes of the B plane and
8 of the N plane: one 16-byte and one 8-byte shared-memory load a row. A group g of 8 weights is
two B words and one N word, and its 8 bf16 come out of 9 instructions (decode_group, emulated in
torch by decode_words): the N word masked (0x87 a byte) gives weights 0-3 their high bytes
[sign, 0000, c >> 1], rotated right by 4 and masked, weights 4-7's; one add puts base / 2 in
every byte's exponent bits; four byte permutes (prmt) interleave the high bytes with the B
bytes into bf16 pairs. The tensor of the 8 outputs is reshaped and permuted back to column order,
a relabelling of registers that convert_layout checks costs nothing (assert_trivial).

The kernel is the ring's structure (shardline/kernels/gluon_ring.py: a producer warp streaming
TMA tiles into a shared-memory ring, the consumer warpgroups multiplying), the product the other
way round: acc[weight rows, x rows] = W_tile @ x_tile.T. Modes, the same tiles and loop:
0 reads the bf16 weight and multiplies it from shared memory (the bf16 baseline); 2 reads it and
multiplies it from registers (what the register operand costs alone); 1 reads the 12-bit form
and rebuilds it in registers. Beside them the engine's own kernels for the product (the H200
table's entry), cuBLAS. Nothing in the engine uses this.
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

X_ROWS = 64  # x's rows: the batch, the wgmma's N (host code takes the int, kernels the constexpr)
ROWS = gl.constexpr(X_ROWS)
MASK = 0x87878787  # a byte's sign bit and its 3 bits of c >> 1


def _column_of_position() -> torch.Tensor:
    """[64] int64: the column k that stored position j of a 64-column block holds."""
    j = torch.arange(64)
    i0, i1, i2 = j & 1, (j >> 1) & 1, (j >> 2) & 1
    g0, g1, g2 = (j >> 3) & 1, (j >> 4) & 1, (j >> 5) & 1
    return i0 + 2 * g1 + 4 * g2 + 8 * i1 + 16 * i2 + 32 * g0


def pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(B plane [N, K] uint8, N plane [N, K / 2] uint8, base, below [N, K] bool) of a bf16 [N, K]
    weight, K a multiple of 64; `below`: the weights under the window (stored as its smallest value)."""
    n, k = w.shape
    if w.dtype != torch.bfloat16 or k % 64:
        raise ValueError(f"pack takes a bf16 [N, K] weight with K a multiple of 64; got {w.dtype} {tuple(w.shape)}")
    bits = w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    sign, exponent, mantissa = bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F
    top = int(exponent.max())
    base = max(top - 15 + ((top - 15) & 1), 0)  # even, and the window reaches the top exponent
    code = exponent - base
    below = code < 0
    zero = torch.zeros_like(code)
    sign, code, mantissa = (torch.where(below, zero, t) for t in (sign, code, mantissa))
    order = (torch.arange(k // 64)[:, None] * 64 + _column_of_position()[None, :]).reshape(-1).to(w.device)
    sign, code, mantissa = sign[:, order], code[:, order], mantissa[:, order]
    b_plane = (((code & 1) << 7) | mantissa).to(torch.uint8)
    s, h = sign.view(n, k // 8, 8), (code >> 1).view(n, k // 8, 8)
    n_bytes = [(s[..., b] << 7) | h[..., b] | (h[..., b + 4] << 4) | (s[..., 4 + (b + 3) % 4] << 3) for b in range(4)]
    n_plane = torch.stack(n_bytes, dim=-1).to(torch.uint8).reshape(n, k // 2)
    return b_plane, n_plane, base, below


def decode_words(b_lo: torch.Tensor, b_hi: torch.Tensor, n_word: torch.Tensor, base: int) -> torch.Tensor:
    """decode_group's instructions on int64 tensors holding 32-bit words: [..., 8] bf16 bit
    patterns (int64) of a group's weights 0-7."""
    add = (base // 2) * 0x01010101
    hi = (n_word & MASK) + add
    rot = ((n_word >> 4) | (n_word << 28)) & 0xFFFFFFFF
    hi_b = (rot & MASK) + add

    def byte(word, b):
        return (word >> (8 * b)) & 0xFF

    out = []
    for word, high in ((b_lo, hi), (b_hi, hi_b)):
        for b in range(4):
            out.append((byte(high, b) << 8) | byte(word, b))
    return torch.stack(out, dim=-1)


def unpack(b_plane: torch.Tensor, n_plane: torch.Tensor, base: int) -> torch.Tensor:
    """The bf16 [N, K] weight the kernel multiplies, by decode_words, in column order."""
    n, k = b_plane.shape
    b = b_plane.view(torch.int32).to(torch.int64).view(n, k // 8, 2) & 0xFFFFFFFF
    nw = n_plane.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    stored = decode_words(b[..., 0], b[..., 1], nw, base).reshape(n, k)
    order = (torch.arange(k // 64)[:, None] * 64 + _column_of_position()[None, :]).reshape(-1).to(b_plane.device)
    bits = torch.empty_like(stored)
    bits[:, order] = stored
    return bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)


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


@gluon.constexpr_function
def _plane_layout(words_per_block, num_warps, width):
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
def _acc_layout(num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[int(getattr(num_warps, "value", num_warps)), 1],
                                     instr_shape=[16, X_ROWS, 16])


@gluon.jit
def decode_group(b_lo, b_hi, n_word, add):
    """The 8 bf16 weights of each group (two B words, one N word; `add`: base / 2 in every byte)."""
    return gl.inline_asm_elementwise(_DECODE, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [b_lo, b_hi, n_word, add],
                                     dtype=[gl.bfloat16] * 8, is_pure=True, pack=1)


@gluon.jit
def _rebuild(b_tile, n_tile, add, BLOCK_K: gl.constexpr, num_warps: gl.constexpr):
    """The A operand [16 * num_warps, BLOCK_K] bf16 from a stage's planes in shared memory."""
    BW: gl.constexpr = 16 * num_warps
    G: gl.constexpr = BLOCK_K // 8
    n_layout: gl.constexpr = _plane_layout(8, num_warps, G)
    b = b_tile.load(_plane_layout(16, num_warps, BLOCK_K // 4))
    nw = n_tile.load(n_layout)
    b_lo, b_hi = gl.split(gl.reshape(b, [BW, G, 2]))
    b_lo = gl.convert_layout(b_lo, n_layout, assert_trivial=True)
    b_hi = gl.convert_layout(b_hi, n_layout, assert_trivial=True)
    adds = gl.full([BW, G], add, gl.int32, layout=n_layout)
    o0, o1, o2, o3, o4, o5, o6, o7 = decode_group(b_lo, b_hi, nw, adds)
    q0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
    q1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
    w = gl.join(q0, q1)  # [BW, G, i0, i1, i2]
    w = gl.reshape(w, [BW, BLOCK_K // 64, 2, 2, 2, 2, 2, 2])  # g as (block, g2, g1, g0)
    w = gl.permute(w, (0, 1, 4, 7, 6, 2, 3, 5))  # column bits k5..k0 = g0, i2, i1, g2, g1, i0
    w = gl.reshape(w, [BW, BLOCK_K])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_acc_layout(num_warps), k_width=2)
    return gl.convert_layout(w, a_layout, assert_trivial=True)


@gluon.jit
def _operand(MODE: gl.constexpr, w_ring, n_ring, slot, add, BLOCK_K: gl.constexpr, num_warps: gl.constexpr):
    if MODE == 0:
        return w_ring.index(slot)
    elif MODE == 2:
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_acc_layout(num_warps), k_width=2)
        return w_ring.index(slot).load(a_layout)
    else:
        return _rebuild(w_ring.index(slot), n_ring.index(slot), add, BLOCK_K, num_warps)


@gluon.jit
def _consumer(x_ring, w_ring, n_ring, ready, empty, k_tiles, add, MODE: gl.constexpr, BLOCK_K: gl.constexpr,
              STAGES: gl.constexpr, num_warps: gl.constexpr):
    """acc [16 * num_warps weight rows, 64 x rows] over the split's K tiles. The next stage's
    operand is rebuilt while the wgmma of this one runs."""
    acc = gl.zeros((16 * num_warps, ROWS), dtype=gl.float32, layout=_acc_layout(num_warps))
    mbarrier.wait(ready.index(0), 0)
    a = _operand(MODE, w_ring, n_ring, 0, add, BLOCK_K, num_warps)
    for i in range(k_tiles):
        slot = i % STAGES
        acc = warpgroup_mma(a, x_ring.index(slot).permute((1, 0)), acc, is_async=True)
        if i + 1 < k_tiles:
            nxt = (i + 1) % STAGES
            mbarrier.wait(ready.index(nxt), ((i + 1) // STAGES) & 1)
            a = _operand(MODE, w_ring, n_ring, nxt, add, BLOCK_K, num_warps)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(slot))
    return (acc,)  # warp_specialize takes the default partition's results as a tuple


@gluon.jit
def _producer(x_desc, w_desc, n_desc, x_ring, w_ring, n_ring, ready, empty, row, k_lo, k_tiles, MODE: gl.constexpr,
              NBYTES: gl.constexpr, STAGES: gl.constexpr):
    """One warp: a stage's `ready` completes when x's tile and the weight's (both planes in mode 1)
    have landed; its `empty` when the consumers are done with it."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    for i in range(k_tiles):
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), (i // STAGES - 1) & 1)
        k = k_lo + i * BLOCK_K
        bar = ready.index(slot)
        mbarrier.expect(bar, NBYTES)
        if MODE == 1:
            tma.async_copy_global_to_shared(w_desc, [row, k // 4], bar, w_ring.index(slot))
            tma.async_copy_global_to_shared(n_desc, [row, k // 8], bar, n_ring.index(slot))
        else:
            tma.async_copy_global_to_shared(w_desc, [row, k], bar, w_ring.index(slot))
        tma.async_copy_global_to_shared(x_desc, [0, k], bar, x_ring.index(slot))


@gluon.jit
def _probe_kernel(x_desc, w_desc, n_desc, part_ptr, M, N, K, add, MODE: gl.constexpr, SPLIT_K: gl.constexpr,
                  STAGES: gl.constexpr, NBYTES: gl.constexpr, num_warps: gl.constexpr):
    """part[pid_k, :M, tile] = x[:, split's K] @ W[tile, split's K].T; W's tile is 16 * num_warps rows
    (one wgmma row block a warpgroup). MODE 0 and 2: w_desc the bf16 weight (n_desc unused); 1:
    w_desc the B plane and n_desc the N plane, as int32 words."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BW: gl.constexpr = 16 * num_warps
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    row = pid_n * BW
    per_split = gl.cdiv(gl.cdiv(K, BLOCK_K), SPLIT_K)
    k_lo = pid_k * per_split * BLOCK_K
    k_tiles = gl.minimum(per_split, gl.cdiv(K, BLOCK_K) - pid_k * per_split)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, ROWS, BLOCK_K], x_desc.layout)
    if MODE == 1:
        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BW, BLOCK_K // 4], w_desc.layout)
        n_ring = gl.allocate_shared_memory(n_desc.dtype, [STAGES, BW, BLOCK_K // 8], n_desc.layout)
    else:
        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BW, BLOCK_K], w_desc.layout)
        n_ring = w_ring
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    acc, = gl.warp_specialize(
        [(_consumer, (x_ring, w_ring, n_ring, ready, empty, k_tiles, add, MODE, BLOCK_K, STAGES, num_warps)),
         (_producer, (x_desc, w_desc, n_desc, x_ring, w_ring, n_ring, ready, empty, row, k_lo, k_tiles, MODE, NBYTES,
                      STAGES))],
        [1], [40])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [1, num_warps], [0, 1])
    acc = gl.convert_layout(acc, out_layout)
    offs_n = row + gl.arange(0, BW, layout=gl.SliceLayout(1, out_layout))
    offs_m = gl.arange(0, ROWS, layout=gl.SliceLayout(0, out_layout))
    gl.store(part_ptr + pid_k * M * N + offs_m[None, :] * N + offs_n[:, None], acc, mask=offs_m[None, :] < M)


def _plane_smem(block_w: int, width: int, swizzle: bool):
    """A plane tile's shared layout: unswizzled, or swizzled as wide as its row (up to 128 bytes) so
    the 8 rows a warp's load spans fall in different banks."""
    if swizzle:
        return gl.NVMMASharedLayout.get_default_for([block_w, width], gl.int32)
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _descriptors(x: torch.Tensor, weight, block_w: int, block_k: int, swizzle: bool = True):
    """(x_desc, w_desc, n_desc, add, mode, bytes a stage) for a bf16 weight or pack's planes."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    x_desc = TensorDescriptor.from_tensor(x, [X_ROWS, block_k], gl.NVMMASharedLayout.get_default_for([X_ROWS, block_k],
                                                                                                  gl.bfloat16))
    if isinstance(weight, torch.Tensor):
        w_desc = TensorDescriptor.from_tensor(weight, [block_w, block_k],
                                              gl.NVMMASharedLayout.get_default_for([block_w, block_k], gl.bfloat16))
        return x_desc, w_desc, w_desc, 0, w_desc.block_shape, 2 * block_k * (X_ROWS + block_w)
    b_plane, n_plane, base = weight
    w_desc = TensorDescriptor.from_tensor(b_plane.view(torch.int32), [block_w, block_k // 4],
                                          _plane_smem(block_w, block_k // 4, swizzle))
    n_desc = TensorDescriptor.from_tensor(n_plane.view(torch.int32), [block_w, block_k // 8],
                                          _plane_smem(block_w, block_k // 8, swizzle))
    return x_desc, w_desc, n_desc, (base // 2) * 0x01010101, None, 2 * block_k * X_ROWS + block_w * block_k * 3 // 2


def probe(x: torch.Tensor, weight, cfg: dict, mode: int | None = None, swizzle: bool = True) -> torch.Tensor:
    """x [M <= 64, K] @ W.T in fp32; `weight` the bf16 W (mode 0, or 2 with mode=2) or pack's
    (B plane, N plane, base) (mode 1, its planes in swizzled shared memory or not). cfg: BLOCK_K,
    SPLIT_K, STAGES, num_warps (4: 64 weight rows a program, 8: 128)."""
    packed = not isinstance(weight, torch.Tensor)
    mode = 1 if packed else (mode or 0)
    n, k = weight[0].shape if packed else weight.shape
    block_w, block_k, split = 16 * cfg["num_warps"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    x_desc, w_desc, n_desc, add, _, nbytes = _descriptors(x, weight, block_w, block_k, swizzle)
    part = torch.empty(split, x.shape[0], n, device=x.device, dtype=torch.float32)
    _probe_kernel[(n // block_w, split)](x_desc, w_desc, n_desc, part, x.shape[0], n, k, add, MODE=mode,
                                         SPLIT_K=split, STAGES=cfg["STAGES"], NBYTES=nbytes,
                                         num_warps=cfg["num_warps"])
    return part.sum(0) if split > 1 else part[0]


def compile_for_sm90(mode: int, block_k: int, stages: int, num_warps: int, split_k: int = 1, swizzle: bool = True):
    """The probe kernel as `probe` launches it, compiled for sm_90 on any machine (no GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    order = list(_probe_kernel.arg_names)
    block_w = 16 * num_warps
    x_layout = gl.NVMMASharedLayout.get_default_for([64, block_k], gl.bfloat16)
    if mode == 1:
        w_desc = f"tensordesc<i32[{block_w}, {block_k // 4}],{_plane_smem(block_w, block_k // 4, swizzle)!r}>"
        n_desc = f"tensordesc<i32[{block_w}, {block_k // 8}],{_plane_smem(block_w, block_k // 8, swizzle)!r}>"
        nbytes = 2 * block_k * 64 + block_w * block_k * 3 // 2
    else:
        w_layout = gl.NVMMASharedLayout.get_default_for([block_w, block_k], gl.bfloat16)
        w_desc = n_desc = f"tensordesc<bf16[{block_w}, {block_k}],{w_layout!r}>"
        nbytes = 2 * block_k * (64 + block_w)
    sig = {"x_desc": f"tensordesc<bf16[64, {block_k}],{x_layout!r}>", "w_desc": w_desc, "n_desc": n_desc,
           "part_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "add": "i32"}
    constexprs = dict(MODE=mode, SPLIT_K=split_k, STAGES=stages, NBYTES=nbytes, num_warps=num_warps)
    sig |= {k: "constexpr" for k in constexprs}
    src = GluonASTSource(fn=_probe_kernel, signature={n: sig[n] for n in order},
                         constexprs={(order.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


SHAPES = {"gate/up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o": (4096, 4096)}
TILES = [dict(BLOCK_K=128, SPLIT_K=1, STAGES=4, num_warps=8),
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=5, num_warps=4),
         dict(BLOCK_K=64, SPLIT_K=1, STAGES=8, num_warps=8),
         dict(BLOCK_K=256, SPLIT_K=1, STAGES=3, num_warps=4),
         dict(BLOCK_K=128, SPLIT_K=2, STAGES=4, num_warps=8),
         dict(BLOCK_K=64, SPLIT_K=2, STAGES=8, num_warps=4),
         dict(BLOCK_K=128, SPLIT_K=4, STAGES=4, num_warps=8),
         # call 2026-12-05 n7 found 8 warps, one wave short of two (gate/up: 224 programs), best at
         # SPLIT_K 1 and down best at SPLIT_K 4: these ask whether two programs a multiprocessor
         # (smaller rings), more K splits, or a deeper ring of 64-column stages do better
         dict(BLOCK_K=64, SPLIT_K=1, STAGES=4, num_warps=8),
         dict(BLOCK_K=64, SPLIT_K=1, STAGES=5, num_warps=8),
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=2, num_warps=8),
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=3, num_warps=8),
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=2, num_warps=4),
         dict(BLOCK_K=64, SPLIT_K=1, STAGES=10, num_warps=8),
         dict(BLOCK_K=128, SPLIT_K=8, STAGES=4, num_warps=8),
         dict(BLOCK_K=64, SPLIT_K=4, STAGES=8, num_warps=4),
         dict(BLOCK_K=64, SPLIT_K=4, STAGES=4, num_warps=8),
         # n8: every tile holds one program a multiprocessor (warp specialization gives the consumers
         # the registers), so 256-row tiles halve x's L2 traffic a weight byte at the same occupancy
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=3, num_warps=16),
         dict(BLOCK_K=128, SPLIT_K=1, STAGES=2, num_warps=16),
         dict(BLOCK_K=64, SPLIT_K=1, STAGES=4, num_warps=16),
         dict(BLOCK_K=128, SPLIT_K=2, STAGES=3, num_warps=16)]


def fits(n: int, k: int, cfg: dict) -> bool:
    return n % (16 * cfg["num_warps"]) == 0 and k % (cfg["BLOCK_K"] * cfg["SPLIT_K"]) == 0


def _occupancy(mode: int, cfg: dict, swizzle: bool) -> dict:
    """Registers a thread, spills and shared bytes of the probe kernel as launched: what decides
    how many programs a multiprocessor holds."""
    try:
        kernel = compile_for_sm90(mode, cfg["BLOCK_K"], cfg["STAGES"], cfg["num_warps"], cfg["SPLIT_K"], swizzle)
        kernel._init_handles()
        return {"regs": kernel.n_regs, "spills": kernel.n_spills, "smem": kernel.metadata.shared}
    except Exception as e:  # the timing stands without it
        return {"occupancy": f"{type(e).__name__}: {e}"[:120]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gate/up,down,qkv,o", help=f"comma list of {','.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="the first two tiles only")
    args = ap.parse_args()
    names = args.shapes.split(",")
    if unknown := [s for s in names if s not in SHAPES]:
        ap.error(f"--shapes {args.shapes}: unknown {unknown}; use a comma list of {','.join(SHAPES)}")
    if not torch.cuda.is_available():
        raise SystemExit("exponent_code_wgmma times GPU kernels; it needs a CUDA GPU")
    from shardline.gemm_tuning import GemmTable, _time_graph_us, agrees
    from shardline.kernels import quant

    table = GemmTable.checked("benchmarks/results/gemm-h200-decode.json")
    torch.manual_seed(0)
    rows = []
    for name in names:
        n, k = SHAPES[name]
        w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16).normal_(0.0, 0.02)  # random_weights' std
        copies = max(1, -(-(512 << 20) // (w.numel() * 2)))  # >= 512 MB of weights: L2 holds none of it
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(X_ROWS, k, device="cuda", dtype=torch.bfloat16)
        packed = [pack(t)[:3] for t in ws]
        below = pack(w)[3].float().mean().item()
        ref = torch.nn.functional.linear(x, w).float()
        ref_e4 = torch.nn.functional.linear(x, unpack(*packed[0])).float()
        gb = w.numel() * 2 / 1e3

        def report(variant, us, ok, cfg=None, **extra):
            rows.append({"shape": name, "variant": variant, "us": round(us, 2), "bf16_GBps": round(gb / us, 1),
                         "tiles": cfg, "agrees": ok, **extra})
            print(json.dumps(rows[-1]), flush=True)

        report("cublas", _time_graph_us(lambda i: torch.nn.functional.linear(x, ws[i]), copies), True)
        entry = table.choice(n, k, torch.bfloat16, torch.bfloat16, X_ROWS)
        run = {"triton": lambda i: quant.small_m_linear(x, ws[i], None, None, entry["config"]),
               "ring": lambda i: quant.ring_linear(x, ws[i], None, entry["config"])}.get((entry or {}).get("impl"))
        if run is not None:  # the H200 table's kernel for the product (the step's fuses an epilogue)
            report(f"engine ({entry['impl']})", _time_graph_us(run, copies), agrees(run(0), ref), entry["config"])
        for cfg in TILES[:2] if args.quick else TILES:
            if not fits(n, k, cfg):
                continue
            variants = [("bf16, A from shared", ws, w, ref, {}), ("bf16, A from registers", ws, w, ref, {"mode": 2}),
                        ("12-bit, plain planes", packed, packed[0], ref_e4, {"swizzle": False}),
                        ("12-bit, swizzled planes", packed, packed[0], ref_e4, {"swizzle": True})]
            for variant, weights, first, want, kw in variants:
                try:
                    us = _time_graph_us(lambda i: probe(x, weights[i], cfg, **kw), copies)
                    report(variant, us, agrees(probe(x, first, cfg, **kw), want), cfg,
                           **_occupancy(kw.get("mode", 1 if weights is packed else 0), cfg, kw.get("swizzle", True)),
                           **({"below": round(below, 6)} if weights is packed else {}))
                except Exception as e:  # a tile that does not compile or fit: say so, go on
                    print(json.dumps({"shape": name, "variant": variant, "tiles": cfg,
                                      "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
        del ws, packed
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}: 64 rows, us a launch (GB/s of the bf16 weight it stands for)")
    best = {}
    for r in rows:
        tiles = "" if r["tiles"] is None else ",".join(f"{a}={b}" for a, b in r["tiles"].items())
        print(f"{r['shape']:<8} {r['variant']:<30} {r['us']:>8.2f} {r['bf16_GBps']:>7.0f}  {tiles}"
              f"{'  WRONG' if r['agrees'] is False else ''}")
        if r["agrees"]:
            key = (r["shape"], r["variant"].split(" (")[0])
            best[key] = min(best.get(key, float("inf")), r["us"])
    for name in names:
        b16, reg, *e4s = (best.get((name, v)) for v in ("bf16, A from shared", "bf16, A from registers",
                                                         "12-bit, plain planes", "12-bit, swizzled planes"))
        e4 = min((t for t in e4s if t), default=None)
        if b16 and reg and e4:
            print(f"{name}: best bf16 {b16:.2f} us; A from registers {reg:.2f} ({reg / b16:.3f}); "
                  f"12-bit {e4:.2f} ({e4 / b16:.3f}; bytes 0.75)")


if __name__ == "__main__":
    main()
