"""The decode step's read floor: its bytes, read by the simplest kernel there is, kernel for kernel.

    python -m benchmarks.read_floor [--batch 64] [--context 192] [--engine --gemm-config T] [--tile-walks]
                                    [--attention-walks]

A Llama-3-8B decode step at batch 64 reads its weights once (qkv, o, gate/up and down a layer, then
the head) and each layer's KV cache (batch x context tokens), and little else: it is bound by
memory. This script reads exactly those bytes, in the step's order, one kernel per product and
one per attention (32 x 5 + 1 launches), with a kernel that only sums what it loads (several
tiles in flight a program, as the GEMMs' weights are), captured in one CUDA graph as the engine's
step is. What that graph takes is the floor a kernel that does real work can hope for with the
step's launches, and it splits the gap to the copy ceiling into what the launch boundaries cost
and what the engine's kernels lose inside:

* each size alone (its copies cycled, so L2 holds none of it): the rate one kernel streams at;
* the shadow step with PDL, each kernel waiting for the one before it first (as the engine's
  attention does), or last (its reads all before the wait, as the ring GEMM's weights): what
  the boundaries cost with and without reads across them;
* the same launched without PDL;
* `--engine`: the engine's own step at the same batch and context, in the same process (its
  replay and decode_bench's ms/step), as a ratio to the floor;
* `--tile-walks`: gate/up's and down's weights read as the split-K GEMM's tiles walk them, with
  no product (TILE_WALKS; row-major, tile-packed, k-major packed, rotated, persistent): what
  the walk costs against a contiguous read of the same bytes; `even` columns deal the (band, k)
  steps evenly over persistent programs, as a stream-K GEMM would;
* `--attention-walks`: one layer's K and V read through the block table as decode attention walks
  them (KV_WALKS), with no math: what the paged walk costs, and what the kernel adds to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from shardline.config import ModelConfig
from shardline.gemm_tuning import linear_shapes
from shardline.model.random_weights import SHAPES

# TMA tiles of BLOCK_R 512-byte rows, or pointer loads of BLOCK elements; STAGES in flight a
# program, PER_SM programs a multiprocessor; grid-strided unless BLOCKED.
CONFIGS = [dict(BLOCK_R=32, STAGES=8, PER_SM=1, num_warps=4), dict(BLOCK_R=32, STAGES=4, PER_SM=2, num_warps=4),
           dict(BLOCK_R=16, STAGES=8, PER_SM=2, num_warps=4), dict(BLOCK_R=64, STAGES=3, PER_SM=1, num_warps=8),
           dict(BLOCK=4096, STAGES=4, PER_SM=4, num_warps=4), dict(BLOCK=8192, STAGES=3, PER_SM=2, num_warps=8),
           dict(BLOCK=8192, STAGES=1, PER_SM=4, num_warps=8),
           # each program its own contiguous share, as a product's program reads its band
           dict(BLOCK_R=32, STAGES=4, PER_SM=2, num_warps=4, BLOCKED=1),
           dict(BLOCK_R=64, STAGES=3, PER_SM=1, num_warps=8, BLOCKED=1)]


def step_reads(cfg: ModelConfig, batch: int, context: int, dtype_bytes: int = 2) -> list[tuple[str, int]]:
    """(name, bytes) of each kernel of a decode step, in order: per layer qkv, attention's KV, o,
    gate/up, down; then the head (the linears' shapes are tune-gemm's, one rank's). Norms and
    activations are a few rows and are left out."""
    shapes = linear_shapes(cfg)
    size = {name: n * k * dtype_bytes for name, (n, k) in shapes.items()}
    kv = batch * context * cfg.num_kv_heads * cfg.head_dim * 2 * dtype_bytes
    layer = [("qkv", size["qkv_proj"]), ("attention KV", kv), ("o", size["o_proj"]), ("gate/up", size["up_proj"]),
             ("down", size["down_proj"])]
    return [item for _ in range(cfg.num_layers) for item in layer] + [("head", size["lm_head"])]


COLS = 256  # elements of a row of the 2-D view a tensor descriptor reads: 512 bytes

try:  # Triton is needed to time, not to count the bytes (step_reads, checked on CPU)
    import triton
    import triton.language as tl

    from shardline.kernels.triton_pdl import pdl_wait
except ImportError:
    triton = None
else:
    @triton.jit
    def _read_tma_kernel(x_desc, out_ptr, n_tiles, BLOCK_R: tl.constexpr, COLS: tl.constexpr, STAGES: tl.constexpr,
                         WAIT_FIRST: tl.constexpr, USE_PDL: tl.constexpr, BLOCKED: tl.constexpr):
        """Add every program-th (BLOCK_R, COLS) tile of x, from this program's on, into a tile of
        sums, then sum that into out[pid]: the copy engine (TMA) fills STAGES tiles ahead, as the
        GEMMs' weight streams do. BLOCKED: program p reads the p-th contiguous share of the tiles
        instead, in order (as a GEMM's program reads its own band). The PDL wait comes first or last."""
        if WAIT_FIRST:
            pdl_wait(USE_PDL)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        share = tl.cdiv(n_tiles, programs)
        acc = tl.zeros([BLOCK_R, COLS], tl.float32)  # elementwise: no reduction inside the loop
        for i in tl.range(0, share, num_stages=STAGES):
            t = pid * share + i if BLOCKED else pid + i * programs
            acc += x_desc.load([t * BLOCK_R, 0]).to(tl.float32)  # past the end: zeros, no reads
        if not WAIT_FIRST:
            pdl_wait(USE_PDL)
        tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))

    @triton.jit
    def _read_ptr_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STAGES: tl.constexpr, WAIT_FIRST: tl.constexpr,
                         USE_PDL: tl.constexpr):
        """The same with pointer loads of BLOCK elements, STAGES of them in flight (cp.async)."""
        if WAIT_FIRST:
            pdl_wait(USE_PDL)
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], tl.float32)
        for start in tl.range(pid * BLOCK, n, tl.num_programs(0) * BLOCK, num_stages=STAGES):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        if not WAIT_FIRST:
            pdl_wait(USE_PDL)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _tile_walk_kernel(w_desc, x_desc, out_ptr, K, bands, STAGES: tl.constexpr, SPLIT_K: tl.constexpr,
                          WITH_X: tl.constexpr, PACKED: tl.constexpr, ROTATE: tl.constexpr, EVEN: tl.constexpr):
        """A split-K product's reads without its product: program (p, s) walks split s of K over
        its band of BLOCK_N weight rows in (BLOCK_N, BLOCK_K) boxes, STAGES deep, and with WITH_X
        also the (64, BLOCK_K) box of x (L2-resident) a step, as a GEMM tile does. Every box is
        only added up elementwise. PACKED: the weights as [N / BLOCK_N, K / BLOCK_K, BLOCK_N,
        BLOCK_K] (w_desc over its [N * K / BLOCK_K, BLOCK_K] view), each box one contiguous run;
        PACKED=2 as [K / BLOCK_K, N / BLOCK_N, BLOCK_N, BLOCK_K], so that programs moving in step
        read one contiguous window; row-major, a box is BLOCK_N runs of BLOCK_K * 2 bytes, each
        in another weight row.
        ROTATE: program p starts its walk p tiles into its split (and wraps), so that programs
        moving in step do not all ask for the same offset of their bands at once.
        EVEN (persistent, SPLIT_K 1): the (band, k) steps dealt evenly, program p the p-th run of
        them (as a stream-K GEMM deals them); packed, each program's run is one contiguous range."""
        BLOCK_N: tl.constexpr = w_desc.block_shape[0]
        BLOCK_K: tl.constexpr = w_desc.block_shape[1]
        pid, split = tl.program_id(0), tl.program_id(1)
        per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc_x = tl.zeros([64, BLOCK_K], tl.float32)
        lo = split * per_split
        n_k = tl.cdiv(tl.minimum(K, lo + per_split) - lo, BLOCK_K)
        programs = tl.num_programs(0)
        # Persistent (fewer programs than bands): program p walks bands p, p + programs, ... in turn,
        # as one pipelined loop over its (band, k) steps.
        if EVEN:
            share = tl.cdiv(bands * n_k, programs)
            first = pid * share
            n_steps = tl.minimum(share, bands * n_k - first)
        else:
            first = 0
            n_steps = tl.cdiv(bands - pid, programs) * n_k
        for j in tl.range(0, n_steps, num_stages=STAGES):
            if EVEN:
                i = (first + j) % n_k
                band = (first + j) // n_k
            else:
                i = j % n_k
                band = pid + (j // n_k) * programs
            k = lo + ((i + pid) % n_k if ROTATE else i) * BLOCK_K
            if PACKED == 2:  # k-major: the boxes of one k, across the bands, side by side
                acc += w_desc.load([(k // BLOCK_K * bands + band) * BLOCK_N, 0]).to(tl.float32)
            elif PACKED:
                acc += w_desc.load([(band * tl.cdiv(K, BLOCK_K) + k // BLOCK_K) * BLOCK_N, 0]).to(tl.float32)
            else:
                acc += w_desc.load([band * BLOCK_N, k]).to(tl.float32)
            if WITH_X:
                acc_x += x_desc.load([0, k]).to(tl.float32)
        total = tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(tl.sum(acc_x, axis=1), axis=0)
        tl.store(out_ptr + pid * SPLIT_K + split, total)


    @triton.jit
    def _kv_walk_kernel(k_ptr, v_ptr, bt_ptr, out_ptr, context, rows, n_kv, stride_bt, stride_blk, stride_tok,
                        BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                        STAGES: tl.constexpr, EVEN: tl.constexpr):
        """Decode attention's reads without its math: the K and V tiles of BLOCK_N tokens of one
        (row, kv head) through the row's block table, only added up. One program an item, its
        tiles in turn (the decode kernel's walk), or EVEN: persistent, the (item, tile) steps
        dealt evenly, so that each program streams from one item into the next."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        n_tiles = tl.cdiv(context, BLOCK_N)
        if EVEN:
            share = tl.cdiv(rows * n_kv * n_tiles, programs)
            first = pid * share
            n_steps = tl.minimum(share, rows * n_kv * n_tiles - first)
        else:
            first = pid * n_tiles
            n_steps = n_tiles
        d = tl.arange(0, HEAD_DIM)
        acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        for j in tl.range(0, n_steps, num_stages=STAGES):
            step = first + j
            item = step // n_tiles
            row, kvh = item % rows, item // rows  # rows fastest, as the decode kernel's grid
            offs = (step % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = offs < context
            blk = tl.load(bt_ptr + row * stride_bt + offs // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
            base = blk * stride_blk + (offs % BLOCK_SIZE) * stride_tok + kvh * HEAD_DIM
            ptrs = base[:, None] + d[None, :]
            acc += tl.load(k_ptr + ptrs, mask=mask[:, None], other=0.0).to(tl.float32)
            acc += tl.load(v_ptr + ptrs, mask=mask[:, None], other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def launcher(config: dict, wait_first: bool, pdl: bool):
    """(read(x, out): one launch of the read kernel over all of x, bf16 and 1-D; its programs).
    A config with BLOCK_R reads tiles of 512-byte rows by TMA; one with BLOCK, by pointers."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from shardline.kernels._dispatch import sm_count
    programs = sm_count(torch.empty(0, device="cuda")) * config["PER_SM"]
    common = dict(STAGES=config["STAGES"], WAIT_FIRST=wait_first, USE_PDL=pdl, num_warps=config["num_warps"],
                  launch_pdl=pdl)

    def read(x: torch.Tensor, out: torch.Tensor) -> None:
        if "BLOCK_R" in config:
            rows = config["BLOCK_R"]
            desc = TensorDescriptor.from_tensor(x.view(-1, COLS), [rows, COLS])
            _read_tma_kernel[(programs,)](desc, out, -(-x.numel() // (rows * COLS)), BLOCK_R=rows, COLS=COLS,
                                          BLOCKED=config.get("BLOCKED", 0), **common)
        else:
            _read_ptr_kernel[(programs,)](x, out, x.numel(), BLOCK=config["BLOCK"], **common)
    return read, programs


# The split-K tiles' walks: (BLOCK_N, BLOCK_K, STAGES, SPLIT_K[, warps]) for gate/up, then for
# down: the first of gate/up's is its tile in the H200 table, the first of down's the split-K tile
# the ring replaced there; the last of gate/up's, with 8 warps, is the walk of the contiguous read
# that streams 4.35 TB/s one program a multiprocessor (BLOCK_R 64, 3 stages, BLOCKED).
TILE_WALKS = {"gate/up": [(128, 128, 4, 1), (128, 128, 3, 1), (64, 128, 4, 1), (128, 64, 6, 1), (64, 256, 4, 1),
                          (32, 256, 4, 1), (64, 256, 3, 1, 8)],
              "down": [(64, 128, 5, 2), (64, 128, 4, 1), (128, 128, 4, 4), (64, 128, 4, 4), (64, 64, 6, 8), (64, 256, 4, 2)]}


def _copies(nbytes: int) -> int:
    """Copies of an nbytes buffer a timing cycles through, so that L2 (50 MB) holds none of the one
    being read: 512 MB of them, at least two."""
    return max(2, -(-512 * 2**20 // nbytes))


def tile_walk_gbps(n: int, k: int, walk: tuple[int, ...], with_x: bool, packed: int = 0,
                   rotate: bool = False, per_sm: int = 0, even: bool = False) -> float:
    """The rate of the tile walk over [n, k] weights alone (copies cycled out of L2), row-major or
    `packed` tile by tile (1: a band's tiles in a row, 2: a k's tiles in a row); `per_sm`: that
    many persistent programs a multiprocessor, each walking band after band (0: one a band), or
    with `even` an equal run of the (band, k) steps (SPLIT_K 1 only)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels._dispatch import sm_count
    bn, bk, stages, split, warps = (*walk, 4) if len(walk) == 4 else walk
    if even and split != 1:
        raise ValueError(f"walk {walk}: an even walk deals (band, k) steps of one split; SPLIT_K must be 1")
    copies = _copies(n * k * 2)
    shape = (n * k // bk, bk) if packed else (n, k)
    ws = [TensorDescriptor.from_tensor(torch.empty(shape, dtype=torch.bfloat16, device="cuda"), [bn, bk])
          for _ in range(copies)]
    x = TensorDescriptor.from_tensor(torch.randn(64, k, dtype=torch.bfloat16, device="cuda"), [64, bk])
    bands = -(-n // bn)
    grid = (min(bands, per_sm * sm_count(torch.empty(0, device="cuda"))) if per_sm else bands, split)
    out = torch.empty(grid[0] * split, dtype=torch.float32, device="cuda")
    us = _time_graph_us(lambda i: _tile_walk_kernel[grid](ws[i], x, out, k, bands, STAGES=stages, SPLIT_K=split,
                                                          WITH_X=with_x, PACKED=packed, ROTATE=rotate,
                                                          EVEN=even, num_warps=warps), copies)
    return n * k * 2 / us / 1e3


# Decode attention's walks: (BLOCK_N, STAGES, programs a multiprocessor; 0: one program an item).
KV_WALKS = [(64, 2, 0), (64, 3, 0), (32, 3, 0), (64, 3, 1), (64, 4, 1), (32, 4, 1), (32, 6, 1), (64, 3, 2), (32, 4, 2)]


def kv_walk_us(cfg: ModelConfig, batch: int, context: int, walk: tuple[int, int, int],
               block_size: int = 16) -> float:
    """Microseconds one layer's K and V reads take walked as decode attention walks them (KV_WALKS),
    over caches of block_size-token blocks, each row's blocks in a run (as after a fresh prefill),
    copies cycled out of L2."""
    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels._dispatch import sm_count
    block_n, stages, per_sm = walk
    n_blocks = -(-context // block_size)
    shape = (batch * n_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    copies = _copies(2 * batch * n_blocks * block_size * cfg.num_kv_heads * cfg.head_dim * 2)
    caches = [(torch.empty(shape, dtype=torch.bfloat16, device="cuda"),
               torch.empty(shape, dtype=torch.bfloat16, device="cuda")) for _ in range(copies)]
    bt = torch.arange(batch * n_blocks, dtype=torch.int32, device="cuda").view(batch, n_blocks)
    items = batch * cfg.num_kv_heads
    programs = per_sm * sm_count(bt) if per_sm else items
    out = torch.empty(programs, dtype=torch.float32, device="cuda")
    k0 = caches[0][0]
    return _time_graph_us(lambda i: _kv_walk_kernel[(programs,)](
        caches[i][0], caches[i][1], bt, out, context, batch, cfg.num_kv_heads, bt.stride(0), k0.stride(0),
        k0.stride(1), BLOCK_N=block_n, BLOCK_SIZE=block_size, HEAD_DIM=cfg.head_dim, STAGES=stages,
        EVEN=bool(per_sm), num_warps=4), copies)


def alone_gbps(read, nbytes: int, programs: int) -> float:
    """One size's rate, its launches back to back in a graph on copies that L2 cannot hold."""
    from shardline.gemm_tuning import _time_graph_us
    copies = _copies(nbytes)
    xs = [torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
    out = torch.empty(programs, dtype=torch.float32, device="cuda")
    us = _time_graph_us(lambda i: read(xs[i], out), copies)
    return nbytes / us / 1e3


def shadow_step_ms(read, buffers: list[torch.Tensor], programs: int) -> float:
    """One replay of a graph that reads each buffer in turn, one launch each (best of three)."""
    from shardline.step_tuning import replay_ms
    out = torch.empty(programs, dtype=torch.float32, device="cuda")
    read(buffers[0], out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in buffers:
            read(x, out)
    return min(replay_ms(graph) for _ in range(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=192, help="tokens each row attends over (decode_bench's mean)")
    ap.add_argument("--engine", action="store_true", help="also time the engine's step at this batch")
    ap.add_argument("--tile-walks", action="store_true",
                    help="also read gate/up's and down's weights as the split-K GEMM's tiles walk them (TILE_WALKS), "
                         "with and without x's boxes, and no product")
    ap.add_argument("--attention-walks", action="store_true",
                    help="also read a layer's K and V as decode attention walks them (KV_WALKS), with no math")
    ap.add_argument("--gemm-config", help="the engine's tune-gemm table (with --engine)")
    args = ap.parse_args()
    if args.batch < 1 or args.context < 1:
        ap.error(f"--batch {args.batch}, --context {args.context}: both must be >= 1")
    if args.gemm_config and not args.engine:
        ap.error("--gemm-config configures the engine's step: pass --engine with it")
    if not torch.cuda.is_available() or triton is None:
        ap.error("read_floor times reads of GPU memory with a Triton kernel: it needs a CUDA GPU and Triton")
    cfg = ModelConfig(**SHAPES[args.shape])
    reads = step_reads(cfg, args.batch, args.context)
    total = sum(n for _, n in reads)
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}")
    print(f"{args.shape}, batch {args.batch}, context {args.context}: {len(reads)} kernels, "
          f"{total / 1e9:.2f} GB a step")

    sizes = sorted({n for _, n in reads})
    names = {n: name for name, n in reversed(reads)}
    best, best_rate = CONFIGS[0], 0.0
    print(f"\nalone (GB/s){'':<14}" + "".join(f"{names[n]:>14}" for n in sizes))
    for c in CONFIGS:
        read, programs = launcher(c, wait_first=True, pdl=True)
        rates = [alone_gbps(read, n, programs) for n in sizes]
        print(f"{json.dumps(c):<26}" + "".join(f"{r:>14.0f}" for r in rates), flush=True)
        mean = sum(rates) / len(rates)
        if mean > best_rate:
            best, best_rate = c, mean

    if args.tile_walks:
        shapes = linear_shapes(cfg)
        products = {"gate/up": shapes["up_proj"], "down": shapes["down_proj"]}
        variants = {"weights": {}, "with x": dict(with_x=True), "packed": dict(packed=1),
                    "k-major": dict(packed=2), "rotated": dict(rotate=True), "persistent 1": dict(per_sm=1),
                    "persistent 2": dict(per_sm=2), "packed, pers. 1": dict(packed=1, per_sm=1),
                    "even 1": dict(per_sm=1, even=True), "packed, even 1": dict(packed=1, per_sm=1, even=True),
                    "packed, even 2": dict(packed=1, per_sm=2, even=True)}
        print("\ntile walks alone, GB/s (BLOCK_N, BLOCK_K, STAGES, SPLIT_K[, warps])"
              + "".join(f"{v:>16}" for v in variants))
        for product, (n, k) in products.items():
            for walk in TILE_WALKS[product]:
                rates = [tile_walk_gbps(n, k, walk, **{"with_x": False, **v}) if walk[3] == 1 or not v.get("even")
                         else float("nan") for v in variants.values()]
                print(f"{product:<8} {str(walk):<50}" + "".join(f"{r:>16.0f}" for r in rates), flush=True)

    if args.attention_walks:
        kv = dict(reads)["attention KV"]
        print(f"\nattention walks alone, one layer's K and V ({kv / 1e6:.1f} MB): (BLOCK_N, STAGES, programs a "
              "multiprocessor; 0: one an item)")
        for walk in KV_WALKS:
            us = kv_walk_us(cfg, args.batch, args.context, walk)
            print(f"{str(walk):<16}{us:>8.1f} us{kv / us / 1e3:>8.0f} GB/s", flush=True)

    buffers = [torch.empty(n // 2, dtype=torch.bfloat16, device="cuda") for _, n in reads]
    rows = []
    for label, wait_first, pdl in (("PDL, wait first", True, True), ("PDL, wait last", False, True),
                                   ("no PDL", True, False)):
        read, programs = launcher(best, wait_first, pdl)
        ms = shadow_step_ms(read, buffers, programs)
        rows.append((f"shadow step, {label}", ms))
    del buffers
    torch.cuda.empty_cache()

    if args.engine:
        from benchmarks import decode_bench
        decode_bench.GEMM_CONFIG = args.gemm_config
        pipeline = decode_bench.build(args.shape, max_num_seqs=args.batch)
        ms = decode_bench.decode_ms_per_step(pipeline, args.batch)  # captures the step's graph
        rows.append(("engine step, graph replay", decode_bench.graph_replay_ms(pipeline, args.batch, args.context)))
        rows.append(("engine decode, ms/step (contexts 128-256)", ms))

    floor = rows[0][1]
    print(f"\nshadow steps on {json.dumps(best)}")
    print(f"{'':<44}{'ms':>8}{'GB/s':>8}{'x floor':>9}")
    for label, ms in rows:
        print(f"{label:<44}{ms:>8.3f}{total / ms / 1e6:>8.0f}{ms / floor:>9.3f}")


if __name__ == "__main__":
    main()
