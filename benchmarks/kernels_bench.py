"""Time each shardline kernel against its torch reference on Llama-3-8B shapes, on one GPU.

    python -m benchmarks.kernels_bench [--only attention,int8] [--sweep]

Every timing is the median over replays of a CUDA graph that calls the op once per input set,
rotating through enough input sets that the data does not sit in L2 (the engine also replays
graphs, so launch gaps are those of a captured step). References that read device values on the
host (paged_attention_ref) cannot be captured and are timed eagerly; they are marked `eager`.
GB/s counts the fewest bytes the op must move (each input read once, each output written once).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import statistics
import sys
import traceback

import torch
import torch.nn.functional as F

if not __package__:  # run as `python benchmarks/kernels_bench.py`, as the older commands in docs/ are
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from benchmarks.arguments import decode_shapes  # noqa: E402
from shardline.kernels import activation, attention, norm, quant, rotary
from shardline.kernels.attention import paged_attention_ref
from shardline.kernels.rotary import rotary_cos_sin
from shardline.model.random_weights import SHAPES

H, NH, NKV, HD, INTER, BLOCK = 4096, 32, 8, 128, 14336, 16  # Llama-3-8B, KV block of 16 tokens
ROT = HD  # rotary dims of a head; --heads sets NH, NKV, HD and ROT from another model's shape
BF16 = torch.bfloat16
L2_ROTATION_BYTES = 256 << 20
ROWS: list[str] = []


def rotation(bytes_per_call: int) -> int:
    return max(1, min(32, math.ceil(L2_ROTATION_BYTES / max(bytes_per_call, 1))))


def time_graph(calls, replays: int = 25, reduce=statistics.median) -> float:
    """Microseconds per call (the median of `replays` replays, or `reduce`'s pick), replaying one
    graph that makes every call once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compile, autotune caches, allocator warm-up: all outside the capture
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return reduce(times)


def time_eager(call, iters: int = 10) -> float:
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def report(op: str, shape: str, impl: str, us: float, nbytes: int | None = None,
           flops: float | None = None, note: str = "") -> None:
    gbs = f"{nbytes / us / 1e3:8.0f}" if nbytes else "       -"
    tflops = f"{flops / us / 1e6:7.1f}" if flops else "      -"
    row = f"{op:22s} {shape:28s} {impl:24s} {us:10.1f} {gbs} {tflops}  {note}"
    ROWS.append(row)
    print(row, flush=True)


def bench(op, shape, impl, make_call, nbytes=None, flops=None, eager=False, note=""):
    """make_call() builds one input set and returns a zero-argument callable over it."""
    try:
        if eager:
            us = time_eager(make_call())
            note = (note + " eager").strip()
        else:
            us = time_graph([make_call() for _ in range(rotation(nbytes or 0))])
        report(op, shape, impl, us, nbytes, flops, note)
        return us
    except Exception as exc:  # one broken variant must not cost the rest of a GPU lease
        print(f"{op:22s} {shape:28s} {impl:24s} FAILED {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc(limit=3)
        return None


def copy_ceiling() -> None:
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8,
                                                                           device="cuda")
    us = time_graph([lambda: dst.copy_(src)], replays=10)
    report("ceiling: d2d copy", "1 GiB", "torch copy_", us, 2 * n)


# ---------------------------------------------------------------------------------------------

def bench_norm() -> None:
    for T in (1, 64, 2048):
        nbytes = 4 * T * H * 2 + H * 2

        def make(fn):
            def build():
                x, r = torch.randn(T, H, device="cuda", dtype=BF16), torch.randn(T, H, device="cuda", dtype=BF16)
                w = torch.randn(H, device="cuda", dtype=BF16)
                return lambda: fn(x, w, 1e-5, r)
            return build
        for impl, fn in (("triton", norm.rms_norm), ("ref (torch ops)", norm.rms_norm_ref)):
            bench("rms_norm+residual", f"T={T} H={H}", impl, make(fn), nbytes)
    for T in (1, 2048):
        nbytes = 4 * T * H * 2 + 2 * H * 2

        def make_ln(fn):
            def build():
                x, r = torch.randn(T, H, device="cuda", dtype=BF16), torch.randn(T, H, device="cuda", dtype=BF16)
                w, b = torch.randn(H, device="cuda", dtype=BF16), torch.randn(H, device="cuda", dtype=BF16)
                return lambda: fn(x, w, b, 1e-5, r)
            return build
        for impl, fn in (("triton", norm.layer_norm), ("ref (torch ops)", norm.layer_norm_ref)):
            bench("layer_norm+residual", f"T={T} H={H}", impl, make_ln(fn), nbytes)


def bench_activation() -> None:
    for T in (1, 64, 2048):
        nbytes = T * 3 * INTER * 2

        def make(fn):
            def build():
                x = torch.randn(T, 2 * INTER, device="cuda", dtype=BF16)
                return lambda: fn(x)
            return build
        for impl, fn in (("triton", activation.silu_and_mul), ("ref (torch ops)", activation.silu_and_mul_ref)):
            bench("silu_and_mul", f"T={T} I={INTER}", impl, make(fn), nbytes)
    for T in (1, 2048):
        n = 16384  # GPT-J-6B MLP width
        nbytes = T * n * 2 * 2

        def make_gelu(fn):
            def build():
                x = torch.randn(T, n, device="cuda", dtype=BF16)
                return lambda: fn(x)
            return build
        for impl, fn in (("triton", activation.gelu_tanh), ("ref (torch ops)", activation.gelu_tanh_ref),
                         ("F.gelu(tanh)", lambda x: F.gelu(x, approximate="tanh"))):
            bench("gelu_tanh", f"T={T} I={n}", impl, make_gelu(fn), nbytes)


def _qkv(T):
    qkv = torch.randn(T, (NH + 2 * NKV) * HD, device="cuda", dtype=BF16)
    q = qkv[:, :NH * HD].view(T, NH, HD)
    k = qkv[:, NH * HD:(NH + NKV) * HD].view(T, NKV, HD)
    v = qkv[:, (NH + NKV) * HD:].view(T, NKV, HD)
    return q, k, v


def bench_rotary_and_kv() -> None:
    cos_sin = rotary_cos_sin(8192, HD, 500000.0, None, device="cuda")
    num_blocks = 4096
    for T in (1, 64, 2048):
        rot_bytes = 2 * T * (NH + NKV) * HD * 2 + T * HD * 4
        kv_bytes = 2 * 2 * T * NKV * HD * 2

        def make_rot(fn):
            def build():
                q, k, _ = _qkv(T)
                pos = torch.randint(0, 8192, (T,), device="cuda")
                return lambda: fn(q, k, pos, cos_sin, HD)
            return build
        for impl, fn in (("triton", rotary.apply_rotary), ("ref (torch ops)", rotary.apply_rotary_ref)):
            bench("apply_rotary", f"T={T} 32q/8kv x128", impl, make_rot(fn), rot_bytes)

        def make_kv(fn):
            def build():
                _, k, v = _qkv(T)
                kc = torch.empty(num_blocks, BLOCK, NKV, HD, device="cuda", dtype=BF16)
                vc = torch.empty_like(kc)
                slots = torch.randperm(num_blocks * BLOCK, device="cuda")[:T]
                return lambda: fn(k, v, kc, vc, slots)
            return build
        for impl, fn in (("triton", attention.write_kv), ("ref (index_copy_)", attention.write_kv_ref)):
            bench("write_kv", f"T={T} 8kv x128", impl, make_kv(fn), kv_bytes)

        def make_fused(mode):
            def build():
                q, k, v = _qkv(T)
                pos = torch.randint(0, 8192, (T,), device="cuda")
                kc = torch.empty(num_blocks, BLOCK, NKV, HD, device="cuda", dtype=BF16)
                vc = torch.empty_like(kc)
                slots = torch.randperm(num_blocks * BLOCK, device="cuda")[:T]
                if mode == "fused":
                    return lambda: rotary.apply_rotary_and_write_kv(q, k, v, pos, cos_sin, HD, kc, vc, slots)
                if mode == "ref":
                    return lambda: rotary.apply_rotary_and_write_kv_ref(q, k, v, pos, cos_sin, HD, kc, vc, slots)

                def two_kernels():
                    q2, k2 = rotary.apply_rotary(q, k, pos, cos_sin, HD)
                    attention.write_kv(k2, v, kc, vc, slots)
                return two_kernels
            return build
        fused_bytes = T * (NH + 2 * NKV) * HD * 2 + T * (NH + 2 * NKV) * HD * 2 + T * HD * 4
        for impl in ("fused", "rotary+write_kv", "ref"):
            bench("rotary+write_kv", f"T={T}", impl, make_fused(impl), fused_bytes)


def _paged(seq_lens_list, q_lens, dtype=BF16, table_width=None, cache_dtype=None):
    """Ragged batch with contexts seq_lens_list, each sequence's blocks scattered in the cache (of
    `cache_dtype`, default q's)."""
    B = len(seq_lens_list)
    blocks = [math.ceil(s / BLOCK) for s in seq_lens_list]
    width = table_width or max(blocks)
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    tables = torch.zeros(B, width, dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[at:at + n]
        at += n
    kc = torch.randn(num_blocks, BLOCK, NKV, HD, device="cuda").to(cache_dtype or dtype)
    vc = torch.randn(kc.shape, device="cuda").to(kc.dtype)
    qsl = torch.tensor([0] + list(q_lens), device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), NH, HD, device="cuda", dtype=dtype)
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32, device="cuda")
    return q, (kc, vc, tables, seq_lens, qsl, HD ** -0.5)


def decode_step_inputs(B: int, ctx: int, head_major: bool = False, dtype=BF16, cache_dtype=None) -> tuple:
    """A decode step's attention inputs, B rows at context ctx, the new tokens not yet rotated or
    cached: (q, k, v, positions, cos_sin, k_cache, v_cache, slots, block_tables, seq_lens,
    query_start_loc, scale). `head_major`: the cache stored [blocks, kv heads, block_size,
    head_dim] (each page of a head contiguous), seen through the usual view. q, k, v are of
    `dtype`, the cache of `cache_dtype` (default: dtype)."""
    _, (kc, vc, tables, seq_lens, qsl, scale) = _paged([ctx] * B, [1] * B, dtype, cache_dtype=cache_dtype)
    if head_major:
        kc, vc = (c.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for c in (kc, vc))
    qkv = torch.randn(B, (NH + 2 * NKV) * HD, device="cuda", dtype=dtype)
    q, k, v = (qkv[:, :NH * HD].view(B, NH, HD), qkv[:, NH * HD:(NH + NKV) * HD].view(B, NKV, HD),
               qkv[:, (NH + NKV) * HD:].view(B, NKV, HD))
    pos = (seq_lens - 1).long()
    slots = tables[torch.arange(B, device="cuda"), pos // BLOCK].long() * BLOCK + pos % BLOCK
    cos_sin = rotary_cos_sin(4096, ROT, 500000.0, None, device="cuda")
    return q, k, v, pos, cos_sin, kc, vc, slots, tables, seq_lens, qsl, scale


# The fused step's decode configs that --sweep times beside the default.
ATTENTION_STEP_SWEEP = (dict(BLOCK_N=64, num_warps=4, num_stages=2), dict(BLOCK_N=32, num_warps=4, num_stages=2),
                        dict(BLOCK_N=32, num_warps=4, num_stages=1), dict(BLOCK_N=32, num_warps=2, num_stages=2))
DECODE_SHAPES = ((1, 192), (1, 2048), (16, 1024), (64, 192), (64, 512), (256, 192))


def bench_decode_attention(sweep: bool, shapes=DECODE_SHAPES) -> None:
    from shardline.kernels.triton_attention import paged_attention_triton
    for B, ctx in shapes:
        nbytes = B * ctx * NKV * HD * 2 * 2 + 2 * B * NH * HD * 2
        shape = f"B={B} ctx={ctx}"

        def make(fn, **kw):
            def build():
                q, args = _paged([ctx] * B, [1] * B)
                return lambda: fn(q, *args, **kw)
            return build
        bench("decode attention", shape, "triton", make(attention.paged_attention), nbytes)

        def make_step(fused: bool, head_major: bool = False):
            """A decode step from the unrotated projections: rotary and the cache write, then
            attention (two kernels), or the three fused in one (what the engine runs).
            `head_major`: the cache stored [blocks, kv heads, block_size, head_dim] (each page of
            a head contiguous), seen through the same [blocks, block_size, kv heads, head_dim] view."""
            def build():
                q, k, v, pos, cs, kc, vc, slots, tables, seq_lens, qsl, scale = decode_step_inputs(B, ctx, head_major)
                if fused:
                    return lambda: attention.rotary_decode_attention(q, k, v, pos, cs, ROT, kc, vc, slots, tables,
                                                                     seq_lens, qsl, scale, max_seq_len=ctx)

                def two_kernels():
                    rq = rotary.apply_rotary_and_write_kv(q, k, v, pos, cs, ROT, kc, vc, slots)
                    return attention.paged_attention(rq, kc, vc, tables, seq_lens, qsl, scale, max_query_len=1,
                                                     max_seq_len=ctx)
                return two_kernels
            return build
        def make_fused(cfg):
            """The fused step (make_step(True)) with the decode kernel's config `cfg`."""
            def build():
                q, k, v, pos, cs, kc, vc, slots, tables, seq_lens, qsl, scale = decode_step_inputs(B, ctx)
                return lambda: paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, scale, max_query_len=1,
                                                      max_seq_len=ctx, decode_config=cfg,
                                                      rotary=(k, v, pos, cs, ROT, slots))
            return build
        bench("decode step attention", shape, "rotary kernel + triton", make_step(False), nbytes)
        bench("decode step attention", shape, "rotary fused in triton", make_step(True), nbytes)
        bench("decode step attention", shape, "rotary fused, head-major cache", make_step(True, True), nbytes)
        if sweep:
            for block_n, warps, stages in itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4)):
                cfg = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
                bench("decode attention", shape, f"triton BLOCK_N={block_n} warps={warps} stages={stages}",
                      make(paged_attention_triton, decode_config=cfg), nbytes)
            for block_n, stages in ((64, 2), (64, 3), (32, 3), (32, 4), (32, 6)):  # block ids by inline PTX
                cfg = dict(BLOCK_N=block_n, num_warps=4, num_stages=stages, OPAQUE_BT=True)
                bench("decode attention", shape, f"triton BLOCK_N={block_n} stages={stages} OPAQUE_BT",
                      make(paged_attention_triton, decode_config=cfg), nbytes)
            for splits in (1, 2, 4, 8, 32):
                bench("decode attention", shape, f"triton splits={splits}",
                      make(paged_attention_triton, num_splits=splits), nbytes)
            for cfg in ATTENTION_STEP_SWEEP:
                bench("decode step attention", shape, "rotary fused, " + " ".join(f"{k}={v}" for k, v in cfg.items()),
                      make_fused(cfg), nbytes)

        def make_sdpa():
            k = torch.randn(B, NKV, ctx, HD, device="cuda", dtype=BF16)
            v = torch.randn_like(k)
            q = torch.randn(B, NH, 1, HD, device="cuda", dtype=BF16)
            return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        bench("decode attention", shape, "SDPA dense (not paged)", make_sdpa, nbytes)
        if B <= 16:
            bench("decode attention", shape, "ref (per-seq loop)", make(paged_attention_ref), nbytes,
                  eager=True)


FP8_DECODE_SHAPES = ((64, 1024), (16, 2048), (64, 192))


def bench_decode_attention_fp8(sweep: bool, shapes=FP8_DECODE_SHAPES) -> None:
    """The engine's fused decode step over a bf16 cache and over an e4m3 one (half the bytes a
    token), at each one's tile (and the e4m3 cache at the bf16 tile), and with --sweep at others;
    and over the e4m3 cache with q, k, v in fp16."""
    from shardline.kernels.triton_attention import decode_config_for, paged_attention_triton
    fp8 = torch.float8_e4m3fn
    for B, ctx in shapes:
        shape = f"B={B} ctx={ctx}"

        def make_fused(cfg, dtype=BF16, cache_dtype=None):
            def build():
                q, k, v, pos, cs, kc, vc, slots, tables, seq_lens, qsl, scale = decode_step_inputs(
                    B, ctx, dtype=dtype, cache_dtype=cache_dtype)
                return lambda: paged_attention_triton(q, kc, vc, tables, seq_lens, qsl, scale, max_query_len=1,
                                                      max_seq_len=ctx, decode_config=cfg,
                                                      rotary=(k, v, pos, cs, ROT, slots))
            return build
        default = decode_config_for(B, HD)
        for name, size, dtype, cache, cfg in (("bf16 cache", 2, BF16, None, default),
                                              ("e4m3 cache, bf16 tile", 1, BF16, fp8, default),
                                              ("e4m3 cache", 1, BF16, fp8, decode_config_for(B, HD, fp8, ctx)),
                                              ("e4m3 cache, q fp16", 1, torch.float16, fp8,
                                               decode_config_for(B, HD, fp8, ctx))):
            nbytes = B * ctx * NKV * HD * 2 * size + 2 * B * NH * HD * 2
            bench("decode step attention", shape, name, make_fused(cfg, dtype, cache), nbytes)
        if sweep:
            nbytes = B * ctx * NKV * HD * 2 + 2 * B * NH * HD * 2
            for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (1, 2, 3, 4)):
                cfg = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
                bench("decode step attention", shape, f"e4m3 BLOCK_N={block_n} w={warps} s={stages}",
                      make_fused(cfg, BF16, fp8), nbytes)
            for splits in (1, 2, 4, 8, 16):
                bench("decode step attention", shape, f"e4m3 default, splits={splits}",
                      make_fused(dict(default, splits=splits), BF16, fp8), nbytes)


def bench_prefill_attention(sweep: bool) -> None:
    from shardline.kernels.triton_attention import paged_attention_triton
    for B, T in ((1, 2048), (4, 512)):
        flops = B * 4 * NH * HD * T * (T + 1) / 2  # causal: QK^T and PV over the visible half
        nbytes = B * T * (NH + 2 * NKV + NH) * HD * 2
        shape = f"B={B} chunk={T} causal"

        def make(fn, **kw):
            def build():
                q, args = _paged([T] * B, [T] * B)
                return lambda: fn(q, *args, **kw)
            return build
        bench("prefill attention", shape, "triton", make(attention.paged_attention), nbytes, flops)
        if sweep:
            for cfg in (dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
                        dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
                        dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2)):
                name = "triton M{BLOCK_M} N{BLOCK_N} w{num_warps} s{num_stages}".format(**cfg)
                bench("prefill attention", shape, name, make(paged_attention_triton, prefill_config=cfg),
                      nbytes, flops)

        def make_sdpa():
            q = torch.randn(B, NH, T, HD, device="cuda", dtype=BF16)
            k = torch.randn(B, NKV, T, HD, device="cuda", dtype=BF16)
            v = torch.randn_like(k)
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        bench("prefill attention", shape, "SDPA dense causal", make_sdpa, nbytes, flops)
    # A mixed step: one 512-token prefill chunk riding with 63 decode tokens at 1k context.
    lens, qlens = [512] + [1024] * 63, [512] + [1] * 63
    nbytes = sum(lens) * NKV * HD * 2 * 2

    def make_mixed():
        q, args = _paged(lens, qlens)
        return lambda: attention.paged_attention(q, *args)
    bench("mixed attention", "1x512 chunk + 63 decode@1k", "triton", make_mixed, nbytes)


LLAMA_LINEARS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))


def _cfg(bm, bn, bk, split, stages, warps):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_stages=stages, num_warps=warps)


INT8_SWEEP = {  # [M > 16] -> alternative launch configs of the int8 kernel
    False: [_cfg(16, 64, 128, s, 4, 4) for s in (1, 2, 4, 8)]
    + [_cfg(16, 32, 256, 4, 4, 4), _cfg(16, 64, 256, 4, 3, 4), _cfg(16, 128, 128, 4, 3, 8),
       _cfg(16, 64, 128, 4, 6, 4)],
    True: [_cfg(64, 64, 128, 1, 4, 8), _cfg(64, 64, 128, 4, 4, 8), _cfg(32, 64, 128, 4, 4, 4),
           _cfg(64, 128, 64, 2, 4, 8)],
}


def bench_int8(sweep: bool) -> None:
    from shardline.kernels.triton_quant import quantized_linear_triton
    per_step = {}
    for M in (1, 16, 64):
        for name, N, K in LLAMA_LINEARS:
            shape = f"M={M} {name} {N}x{K}"
            int8_bytes = N * K + N * 2 + M * K * 2 + M * N * 2
            bf16_bytes = N * K * 2 + M * K * 2 + M * N * 2

            def make(fn, **kw):
                def build():
                    x = torch.randn(M, K, device="cuda", dtype=BF16)
                    w = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8)
                    s = (torch.rand(N, device="cuda") * 0.01).to(BF16)
                    return lambda: fn(x, w, s, **kw)
                return build

            def make_bf16():
                x = torch.randn(M, K, device="cuda", dtype=BF16)
                w = torch.randn(N, K, device="cuda", dtype=BF16)
                return lambda: F.linear(x, w)
            t8 = bench("quantized_linear", shape, "triton", make(quant.quantized_linear), int8_bytes,
                       flops=2 * M * N * K)
            tb = bench("bf16 linear", shape, "F.linear (cuBLAS)", make_bf16, bf16_bytes, flops=2 * M * N * K)
            if M == 1:
                bench("quantized_linear", shape, "ref (dequant+linear)", make(quant.quantized_linear_ref), int8_bytes)
            if sweep:
                for cfg in INT8_SWEEP[M > 16]:
                    label = "M{BLOCK_M} N{BLOCK_N} K{BLOCK_K} split{SPLIT_K} s{num_stages} w{num_warps}"
                    bench("quantized_linear", shape, label.format(**cfg), make(quantized_linear_triton, config=cfg),
                          int8_bytes)
            if t8 and tb:
                per_step.setdefault(M, [0.0, 0.0])
                per_step[M][0] += t8 * 32
                per_step[M][1] += tb * 32
    for M, (t8, tb) in per_step.items():
        print(f"# linear layers of one Llama-3-8B decode step at M={M} (32 layers, no lm_head): "
              f"int8 {t8 / 1e3:.2f} ms vs bf16 {tb / 1e3:.2f} ms ({tb / t8:.2f}x)", flush=True)


def bench_sampling() -> None:
    """Greedy sampling's argmax over Llama-3's fp32 logits: torch's against the Triton kernel
    (shardline.kernels.argmax)."""
    from shardline.kernels.argmax import argmax_rows
    vocab = 128256
    for B in (1, 16, 64):
        def make(fn):
            def build():
                x = torch.randn(B, vocab, device="cuda")
                return lambda: fn(x)
            return build
        for impl, fn in (("torch argmax", lambda x: x.argmax(dim=-1)), ("triton", argmax_rows)):
            bench("greedy argmax", f"B={B} V={vocab} fp32", impl, make(fn), B * vocab * 4)


SECTIONS = {"norm": bench_norm, "activation": bench_activation, "rotary": bench_rotary_and_kv,
            "decode": bench_decode_attention, "decode-fp8": bench_decode_attention_fp8,
            "prefill": bench_prefill_attention, "int8": bench_int8,
            "sampling": bench_sampling}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    parser.add_argument("--sweep", action="store_true", help="also time alternative launch configs")
    parser.add_argument("--decode-shapes", type=decode_shapes,
                        help="decode attention's (batch x context) shapes, e.g. 64x192,64x256")
    parser.add_argument("--heads", choices=sorted(n for n, c in SHAPES.items() if c["position"] == "rotary"),
                        default="llama3-8b",
                        help="the attention sections' heads: query heads, KV heads, head_dim and rotary dims of "
                             "this model shape (shardline.model.random_weights.SHAPES)")
    args = parser.parse_args()
    global NH, NKV, HD, ROT
    shape = SHAPES[args.heads]
    NH, NKV, HD, ROT = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["rotary_dim"]
    import triton
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# attention heads ({args.heads}): {NH} query, {NKV} KV, head_dim {HD}, rotary dims {ROT}")
    print(f"{'op':22s} {'shape':28s} {'impl':24s} {'us':>10s} {'GB/s':>8s} {'TFLOP/s':>7s}")
    torch.manual_seed(0)
    copy_ceiling()
    for name in args.only.split(","):
        kw = {"sweep": args.sweep} if name in ("decode", "decode-fp8", "prefill", "int8") else {}
        if name in ("decode", "decode-fp8") and args.decode_shapes:
            kw["shapes"] = args.decode_shapes
        try:
            SECTIONS[name](**kw)
        except Exception:
            traceback.print_exc()
        torch.cuda.empty_cache()
    copy_ceiling()  # again, with the clocks up: the first reading can come from an idle card


if __name__ == "__main__":
    main()
