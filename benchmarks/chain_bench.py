"""A prototype for the batch-64 boundaries: two ring GEMMs as one kernel that spans the boundary
between them, against the two ring kernels the engine launches (with PDL), on the GPU.

    python -m benchmarks.chain_bench [--pairs 16] [--rounds 5]

The pair is Llama-3-8B's down projection (64 rows, K 14,336, the table's 64-row tiles of 128
columns in two K splits) and the next layer's qkv (K 4,096, 64-row tiles), without the folds
(no residual add or norm: the mechanism only). In the chained kernel each program's producer warp
streams down's weights, then qkv's, into one shared-memory ring with no kernel boundary between:
it requests qkv's first weight tiles as soon as down's MMAs free their slots, and only qkv's x
(down's output) waits, on a counter that each finished down tile bumps. The consumers finish
down's tile (its split partials, the last split's sum) while those weights land. `dram_timeline`
measured ~6 µs a layer lost at this boundary (docs/benchmarks.md); this times how much a kernel
that spans it takes back, and checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from benchmarks.kernels_bench import time_graph
from shardline.kernels.gluon_ring import BLOCK_M, _gdc_launch_dependents, _gdc_wait, _out_layout
from shardline.kernels.quant import RING_MAX_M


@gluon.jit
def _fence_proxy_async():
    """Order this thread's generic-proxy global accesses with the async proxy's (TMA)."""
    gl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _backoff():
    """Sleep a little between polls of a global counter, so that 96 programs polling one line do
    not queue the atomics that move it behind their loads."""
    gl.inline_asm_elementwise("nanosleep.u32 128; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _request_b_weights(wb_desc, w_ring, ready, empty, slot, c, row_b, k, nbytes: gl.constexpr, STAGES: gl.constexpr):
    """Wait for ring slot `slot` (its c-th use) to be free, arm it for a stage and request B's weight tile."""
    if c >= STAGES:
        mbarrier.wait(empty.index(slot), (c // STAGES - 1) & 1)
    mbarrier.expect(ready.index(slot), nbytes)
    tma.async_copy_global_to_shared(wb_desc, [row_b, k], ready.index(slot), w_ring.index(slot))


@gluon.jit
def _chain_producer(xa_desc, wa_desc, xb_desc, wb_desc, x_ring, w_ring, ready, empty, row_a, ka_lo, ka_tiles,
                    row_b, kb_tiles, done_ptr, done_target, flag_ptr, STAGES: gl.constexpr, TILE_FLAGS: gl.constexpr,
                    BACKOFF: gl.constexpr, USE_PDL: gl.constexpr):
    """TILE_FLAGS: B's k-tile j waits only for the A tiles that hold its columns (their flags),
    not for every A tile (the done counter)."""
    BLOCK_K: gl.constexpr = xa_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = wa_desc.block_type.shape[0]
    nbytes: gl.constexpr = xa_desc.block_type.nbytes + wa_desc.block_type.nbytes
    for s in gl.static_range(STAGES):  # A's weights depend on no kernel ahead
        mbarrier.expect(ready.index(s), nbytes, pred=s < ka_tiles)
        tma.async_copy_global_to_shared(wa_desc, [row_a, ka_lo + s * BLOCK_K], ready.index(s), w_ring.index(s),
                                        pred=s < ka_tiles)
    if USE_PDL:
        _gdc_wait()
    for i in range(ka_tiles):
        slot = i % STAGES
        if i >= STAGES:
            mbarrier.wait(empty.index(slot), (i // STAGES - 1) & 1)
            mbarrier.expect(ready.index(slot), nbytes)
            tma.async_copy_global_to_shared(wa_desc, [row_a, ka_lo + i * BLOCK_K], ready.index(slot),
                                            w_ring.index(slot))
        tma.async_copy_global_to_shared(xa_desc, [0, ka_lo + i * BLOCK_K], ready.index(slot), x_ring.index(slot))
    # B: its weights as A's slots free up; its x, A's output, once every A tile is written.
    pre = gl.minimum(kb_tiles, STAGES)
    for j in range(pre):
        c = ka_tiles + j
        _request_b_weights(wb_desc, w_ring, ready, empty, c % STAGES, c, row_b, j * BLOCK_K, nbytes, STAGES)
    if not TILE_FLAGS and kb_tiles > 0:
        seen = gl.atomic_add(done_ptr, 0, sem="acquire", scope="gpu")
        while seen < done_target:
            if BACKOFF:
                _backoff()
            seen = gl.atomic_add(done_ptr, 0, sem="acquire", scope="gpu")
        _fence_proxy_async()
    for j in range(kb_tiles):
        c = ka_tiles + j
        slot = c % STAGES
        if j >= pre:
            _request_b_weights(wb_desc, w_ring, ready, empty, slot, c, row_b, j * BLOCK_K, nbytes, STAGES)
        if TILE_FLAGS:
            for t in range(j * BLOCK_K // BLOCK_N, ((j + 1) * BLOCK_K - 1) // BLOCK_N + 1):
                seen = gl.atomic_add(flag_ptr + t, 0, sem="acquire", scope="gpu")
                while seen == 0:
                    if BACKOFF:
                        _backoff()
                    seen = gl.atomic_add(flag_ptr + t, 0, sem="acquire", scope="gpu")
            _fence_proxy_async()
        tma.async_copy_global_to_shared(xb_desc, [0, j * BLOCK_K], ready.index(slot), x_ring.index(slot))


@gluon.jit
def _chain_consumer(x_ring, w_ring, ready, empty, ka_tiles, kb_tiles, part_ptr, count_ptr, ya_ptr, done_ptr,
                    flag_ptr, tile_a, split_a, M, NA, stride_ya, BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr,
                    STAGES: gl.constexpr, TILE_FLAGS: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr):
    if USE_PDL:
        _gdc_wait()
        _gdc_launch_dependents()
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    for i in range(ka_tiles):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(x_ring.index(slot), w_ring.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(slot))
    # A's epilogue, while the producer streams B's weights: the split's partial, and the last
    # split to arrive sums them (in split order), writes the tile and bumps the done counter.
    out_layout: gl.constexpr = _out_layout(num_warps)
    a = gl.convert_layout(acc, out_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_n = tile_a * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    mask = (offs_m[:, None] < M) & (offs_n < NA)[None, :]
    tile_offs = offs_m[:, None] * NA + offs_n[None, :]
    gl.store(part_ptr + split_a * M * NA + tile_offs, a, mask=mask)
    gl.thread_barrier()  # the warpgroup's partial is written before the counter moves
    arrived = gl.atomic_add(count_ptr + tile_a, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT_K - 1:
        y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=out_layout)
        for s in gl.static_range(SPLIT_K):
            y += gl.load(part_ptr + s * M * NA + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
        gl.atomic_xchg(count_ptr + tile_a, 0)
        gl.store(ya_ptr + offs_m[:, None] * stride_ya + offs_n[None, :], y.to(ya_ptr.dtype.element_ty), mask=mask)
        gl.thread_barrier()
        _fence_proxy_async()  # B's TMA loads of this tile come after the counter, in the async proxy
        if TILE_FLAGS:
            gl.atomic_xchg(flag_ptr + tile_a, 1, sem="release", scope="gpu")
        else:
            gl.atomic_add(done_ptr, 1, sem="release", scope="gpu")
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
    for j in range(kb_tiles):
        c = ka_tiles + j
        slot = c % STAGES
        mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
        acc = warpgroup_mma(x_ring.index(slot), w_ring.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(slot))
    return (acc,)


@gluon.jit
def _chain_kernel(xa_desc, wa_desc, xb_desc, wb_desc, ya_ptr, yb_ptr, part_ptr, count_ptr, done_ptr, exit_ptr,
                  flag_ptr, M, NA, KA, NB, KB, stride_ya, stride_yb, BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr,
                  STAGES: gl.constexpr, TILE_FLAGS: gl.constexpr, TILES_P2: gl.constexpr, BACKOFF: gl.constexpr,
                  USE_PDL: gl.constexpr, num_warps: gl.constexpr):
    """Program p: A's tile p % (NA / BLOCK_N) over K split p // (NA / BLOCK_N), then B's tile p
    (if p < NB / BLOCK_N) over all of KB. Every A split's program runs at once (one a
    multiprocessor, as many as A has tiles x splits), so the done counter cannot wait on a
    program that has not started."""
    BLOCK_K: gl.constexpr = xa_desc.block_type.shape[1]
    pid = gl.program_id(0)
    tiles_a = gl.cdiv(NA, BLOCK_N)
    tile_a = pid % tiles_a
    split_a = pid // tiles_a
    ka_all = gl.cdiv(KA, BLOCK_K)
    per_split = gl.cdiv(ka_all, SPLIT_K)
    ka_lo = split_a * per_split * BLOCK_K
    ka_tiles = gl.maximum(gl.minimum(per_split, ka_all - split_a * per_split), 0)
    has_b = pid < gl.cdiv(NB, BLOCK_N)
    kb_tiles = gl.where(has_b, gl.cdiv(KB, BLOCK_K), 0)
    row_b = pid * BLOCK_N

    x_ring = gl.allocate_shared_memory(xa_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], xa_desc.layout)
    w_ring = gl.allocate_shared_memory(wa_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], wa_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    acc, = gl.warp_specialize(
        [(_chain_consumer, (x_ring, w_ring, ready, empty, ka_tiles, kb_tiles, part_ptr, count_ptr, ya_ptr, done_ptr,
                            flag_ptr, tile_a, split_a, M, NA, stride_ya, BLOCK_N, SPLIT_K, STAGES, TILE_FLAGS,
                            USE_PDL, num_warps)),
         (_chain_producer, (xa_desc, wa_desc, xb_desc, wb_desc, x_ring, w_ring, ready, empty, tile_a * BLOCK_N,
                            ka_lo, ka_tiles, row_b, kb_tiles, done_ptr, tiles_a, flag_ptr, STAGES, TILE_FLAGS,
                            BACKOFF, USE_PDL))],
        [1], [40])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    out_layout: gl.constexpr = _out_layout(num_warps)
    y = gl.convert_layout(acc, out_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_n = row_b + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    mask = (offs_m[:, None] < M) & ((offs_n < NB) & has_b)[None, :]
    gl.store(yb_ptr + offs_m[:, None] * stride_yb + offs_n[None, :], y.to(yb_ptr.dtype.element_ty), mask=mask)
    # The last program out resets the done counter: every program that waits on it is past that.
    gl.thread_barrier()
    if gl.atomic_add(exit_ptr, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) - 1:
        gl.atomic_xchg(done_ptr, 0)
        gl.atomic_xchg(exit_ptr, 0)
        if TILE_FLAGS:
            flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
            t = gl.arange(0, TILES_P2, layout=flat)
            gl.store(flag_ptr + t, gl.zeros((TILES_P2,), gl.int32, layout=flat), mask=t < tiles_a)


def chain(xa: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor, split_k: int = 2, stages: int = 6,
          block_n: int = 64, block_k: int = 128, tile_flags: bool = False,
          backoff: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ya, yb) = (xa @ wa.T, ya @ wb.T) by the chained kernel; xa [M <= 64, KA] bf16. `tile_flags`:
    B's k-tiles wait for their own A tiles only. `backoff`: the producers sleep between polls."""
    M, KA = xa.shape
    NA, NB, KB = wa.shape[0], wb.shape[0], wb.shape[1]
    if KB != NA or M > RING_MAX_M or NA % block_n or NB % block_n:
        raise ValueError(f"chain: xa [{M}, {KA}], wa [{NA}, {KA}], wb [{NB}, {KB}]: wb's K must be wa's N, at most "
                         f"{RING_MAX_M} rows, and both N multiples of BLOCK_N {block_n}")
    tiles_a = NA // block_n
    programs = max(tiles_a * split_k, NB // block_n)
    sms = torch.cuda.get_device_properties(xa.device).multi_processor_count
    if tiles_a * split_k > sms:  # a waiting program would hold a multiprocessor an A split needs
        raise ValueError(f"chain: {tiles_a} A tiles x {split_k} splits = {tiles_a * split_k} programs, above the "
                         f"{sms} multiprocessors that must hold them all at once; fewer splits or taller tiles")
    ya = torch.empty((M, NA), dtype=xa.dtype, device=xa.device)
    yb = torch.empty((M, NB), dtype=xa.dtype, device=xa.device)
    part = torch.empty((split_k, M, NA), dtype=torch.float32, device=xa.device)
    counters = _counters(xa.device, 2 * tiles_a + 2)
    elem = gl.bfloat16
    x_layout = gl.NVMMASharedLayout.get_default_for([RING_MAX_M, block_k], elem)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], elem)
    xa_desc = TensorDescriptor.from_tensor(xa, [RING_MAX_M, block_k], x_layout)
    xb_desc = TensorDescriptor.from_tensor(ya, [RING_MAX_M, block_k], x_layout)
    wa_desc = TensorDescriptor.from_tensor(wa, [block_n, block_k], w_layout)
    wb_desc = TensorDescriptor.from_tensor(wb, [block_n, block_k], w_layout)
    _chain_kernel[(programs,)](xa_desc, wa_desc, xb_desc, wb_desc, ya, yb, part, counters[2:], counters[0:1],
                               counters[1:2], counters[2 + tiles_a:], M, NA, KA, NB, KB, ya.stride(0), yb.stride(0),
                               BLOCK_N=block_n, SPLIT_K=split_k, STAGES=stages, TILE_FLAGS=tile_flags,
                               TILES_P2=1 << (tiles_a - 1).bit_length(), BACKOFF=backoff, USE_PDL=True, num_warps=4,
                               launch_pdl=True)
    return ya, yb


_counter_buffers: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters kept for the process (a captured graph points at them): [done,
    exit, A's tile counters...]."""
    buf = _counter_buffers.get(device)
    if buf is None or buf.numel() < n:
        buf = _counter_buffers[device] = torch.zeros(max(n, 256), dtype=torch.int32, device=device)
    return buf


def compile_for_sm90(tile_flags: bool = False, backoff: bool = False):
    """The chained kernel as `chain` launches it (64-row tiles of 128 columns, six stages, two K
    splits), compiled for sm_90 on any machine: what a CPU test checks it builds to."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    order = list(_chain_kernel.arg_names)
    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    sig = {n: f"tensordesc<bf16[64, 128],{layout!r}>" for n in ("xa_desc", "wa_desc", "xb_desc", "wb_desc")}
    sig |= {n: "*bf16" for n in ("ya_ptr", "yb_ptr")} | {"part_ptr": "*fp32"}
    sig |= {n: "*i32" for n in ("count_ptr", "done_ptr", "exit_ptr", "flag_ptr")}
    sig |= {n: "i32" for n in ("M", "NA", "KA", "NB", "KB", "stride_ya", "stride_yb")}
    constexprs = dict(BLOCK_N=64, SPLIT_K=2, STAGES=6, TILE_FLAGS=tile_flags, TILES_P2=64, BACKOFF=backoff,
                      USE_PDL=True, num_warps=4)
    sig |= {k: "constexpr" for k in constexprs}
    src = GluonASTSource(fn=_chain_kernel, signature={n: sig[n] for n in order},
                         constexprs={(order.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def two_kernels(xa: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's pair: the ring GEMM at the table's down tile, then at qkv's (no folds)."""
    from shardline.kernels import quant
    ya = quant.ring_linear(xa, wa, None, dict(BLOCK_N=64, BLOCK_K=128, STAGES=6, SPLIT_K=2))
    return ya, quant.ring_linear(ya, wb, None, dict(BLOCK_N=64, BLOCK_K=128, STAGES=4, SPLIT_K=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=16, help="down -> qkv pairs in the graph, each with its own weights")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.pairs < 1 or args.rounds < 1:
        ap.error(f"--pairs {args.pairs}, --rounds {args.rounds}: both at least 1")
    if not torch.cuda.is_available():
        ap.error("chain_bench times Hopper kernels on a CUDA GPU; none is visible")
    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    pairs = [(torch.randn(64, 14336, device=dev, dtype=bf16), torch.randn(4096, 14336, device=dev, dtype=bf16) * 0.01,
              torch.randn(6144, 4096, device=dev, dtype=bf16) * 0.02) for _ in range(args.pairs)]
    variants = (("chained", chain), ("chained, backoff", functools.partial(chain, backoff=True)),
                ("chained, tile flags, backoff", functools.partial(chain, tile_flags=True, backoff=True)))
    results = {}
    for name, fn in variants:
        for i in range(2):  # the second launch checks that the counters were reset
            want, got = two_kernels(*pairs[i % len(pairs)]), fn(*pairs[i % len(pairs)])
            torch.cuda.synchronize()
            results[f"{name}: identical, launch {i + 1}"] = all(torch.equal(g, w) for g, w in zip(got, want))
    for r in range(2):
        for name, fn in (("two kernels", two_kernels), *variants):
            calls = [functools.partial(fn, *pair) for pair in pairs]
            results[f"{name}, us a pair, round {r + 1}"] = round(time_graph(calls, args.rounds, reduce=min), 2)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "pairs": args.pairs, "us_per_pair": results}))


if __name__ == "__main__":
    main()
