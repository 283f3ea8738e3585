"""The 12-bit weight form rebuilt straight into the wgmma operand's registers, in Gluon. A probe.

    python -m benchmarks.exponent_code_wgmma [--shapes gate/up,down,qkv,o] [--quick] [--engine]

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
table's entry), cuBLAS. The engine's kernel grew from it: shardline/kernels/gluon_exp12.py (the form: exp12.py).
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from shardline.kernels.exp12 import column_of_position as _column_of_position  # noqa: F401 (the tests')
from shardline.kernels.exp12 import decode_words, unpack  # noqa: F401
from shardline.kernels.exp12 import planes as pack
from shardline.kernels.gluon_exp12 import acc_layout as _acc_layout
from shardline.kernels.gluon_exp12 import rebuild as _rebuild

X_ROWS = 64  # x's rows: the batch, the wgmma's N (host code takes the int, kernels the constexpr)
ROWS = gl.constexpr(X_ROWS)


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


def engine_gate_up() -> None:
    """gate/up at 64 rows as the step runs it (SwiGLU and the RMSNorm fold in the epilogue): the
    table's kernel on the bf16 weight against the engine's 12-bit kernel (quant.exp12_linear,
    corrections included) for exp12.EXP12_TILES (tune-gemm --in-step's), each checked against the bf16
    weight's reference."""
    from shardline.gemm_tuning import GemmTable, _time_graph_us, agrees
    from shardline.kernels import quant
    from shardline.kernels.exp12 import EXP12_TILES
    from shardline.kernels.exp12 import pack as pack_form
    from shardline.kernels.norm import RowNorm

    n, k = SHAPES["gate/up"]
    table = GemmTable.checked("benchmarks/results/gemm-h200-decode.json")
    entry = table.choice(n, k, torch.bfloat16, torch.bfloat16, X_ROWS)
    torch.manual_seed(0)
    w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16).normal_(0.0, 0.02)
    ws = [w] + [w.clone() for _ in range(2)]  # 705 MB: L2 holds none of it
    forms = [pack_form(t, glu=True) for t in ws]
    x = torch.randn(X_ROWS, k, device="cuda", dtype=torch.bfloat16)
    norm = RowNorm(torch.rand(32, X_ROWS, device="cuda") * 100 + 1, 1e-5)
    ref = quant._reference(x, w, None, None, True, None, norm)
    rows = []
    table_run = lambda i: quant.small_m_linear(x, ws[i], None, None, entry["config"], glu=True, norm=norm)  # noqa: E731
    rows.append(("table's " + entry["impl"], _time_graph_us(table_run, 3), agrees(table_run(0), ref), entry["config"]))
    for cfg in EXP12_TILES:
        run = lambda i: quant.exp12_linear(x, forms[i], config=cfg, norm=norm)  # noqa: E731
        rows.append(("12-bit (exp12)", _time_graph_us(run, 3), agrees(run(0), ref), cfg))
    print(f"\n{torch.cuda.get_device_name()}: gate/up {n}x{k}, 64 rows, SwiGLU and the norm fold; "
          f"{forms[0].entries} correction entries a tile, {int((forms[0].corr_rows >= 0).sum())} in all")
    base = rows[0][1]
    for name, us, ok, cfg in rows:
        print(f"{name:<22} {us:8.2f} us  {us / base:6.3f}  {'ok' if ok else 'WRONG'}  {cfg}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gate/up,down,qkv,o", help=f"comma list of {','.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true", help="the first two tiles only")
    ap.add_argument("--engine", action="store_true",
                    help="only gate/up as the step runs it: the table's kernel against the engine's 12-bit kernel")
    args = ap.parse_args()
    if args.engine:
        if not torch.cuda.is_available():
            raise SystemExit("exponent_code_wgmma times GPU kernels; it needs a CUDA GPU")
        return engine_gate_up()
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
