"""Would x multicast across a cluster pay? The products' reads at batch 64, walked with no math.

    python -m benchmarks.multicast_probe [--products o,qkv,down,gate/up] [--reps 24]

At 64 rows every program of a decode product reads all of x (64 x K, from L2) beside its own
weight rows: o's 32-row tiles take 2 bytes of x a weight byte, qkv's and down's 64-row tiles 1,
gate/up's 128 rows 0.5, and o's loop streams ~9.4 TB/s through L2 (docs/benchmarks.md, session b).
Hopper can deliver one L2 read into the shared memory of every program of a cluster
(`cp.async.bulk ... .multicast::cluster`), which Gluon 3.6 does not expose; before a GEMM is built
on it, this kernel measures what it could buy. A CUDA C kernel (WALK below) reads what a product's
program reads, the way the ring GEMM does (a producer warp filling a ring of shared-memory stages,
consumer warps reading each stage once and freeing it), and nothing else:

* weights: each program's BN rows, BK columns a stage (x not read): the floor for the walk;
* x: the same with the stage's x tile (64 rows) beside the weights, each program its own copy;
* mcast C: programs in clusters of C; each issues 64 / C of x's rows to all C programs at once,
  and a stage is refilled only once every program of the cluster has freed it;
* cluster C: clusters of C, each program still reading all of x (the cost of clustering alone).

Each variant is timed in one CUDA graph of back-to-back launches, weight copies cycled out of
L2, x resident in it (as it is in the step, written by the kernel ahead). GPU only; the source
compiles on any machine with NVRTC (the CPU test).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import sys

import torch

WALK = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_copy(u32 dst, const unsigned char* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
#if CLUSTER > 1
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// The same bytes into the same shared-memory offset of every program in the cluster (mask), each
// destination's barrier at `bar`'s offset counting them.
__device__ __forceinline__ void bulk_multicast(u32 dst, const unsigned char* src, u32 bytes, u32 bar, unsigned short mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1], %2, [%3], %4;" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}
// Arrive on the barrier at `bar`'s offset in program `cta` of the cluster.
__device__ __forceinline__ void arrive_remote(u32 bar, u32 cta) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
// A stage's empty barrier counts arrivals from every program of the cluster: wait at its scope.
__device__ __forceinline__ void mbar_wait_cluster(u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}
#define CLUSTER_ATTR __cluster_dims__(CLUSTER, 1, 1)
#else
#define CLUSTER_ATTR
#define mbar_wait_cluster mbar_wait
#endif

__device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#define ROW_BYTES (BK * 2)
#define PITCH (ROW_BYTES + 16)   // a padded row: ldmatrix's eight rows fall in different banks
#define W_STAGE (BN * PITCH)
#define STAGE (W_STAGE + (X ? 64 * PITCH : 0))

extern "C" __global__ void CLUSTER_ATTR __launch_bounds__((WARPS + 1) * 32)
walk(const unsigned char* __restrict__ w, const unsigned char* __restrict__ x, void* __restrict__ out, int N, int K)
{
    extern __shared__ __align__(128) unsigned char stages[];
    __shared__ u64 full[STAGES], empty[STAGES];
    // A consumer warp done with stage s frees it in every program of the cluster (their producers
    // multicast x into it).
    auto free_stage = [&](int s, int lane) {
#if CLUSTER > 1
        if (lane < CLUSTER) arrive_remote(smem_u32(&empty[s]), lane);
#else
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(&empty[s])) : "memory");
#endif
    };
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, steps = K / BK;
    const size_t k_bytes = (size_t)K * 2;
#if CLUSTER > 1
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(&empty[s])), "r"(WARPS * CLUSTER));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#if CLUSTER > 1
    cluster_sync();  // every program's barriers are set before any copy or arrive reaches them
#endif
    u32 acc = 0;
    if (warp == WARPS) {  // the producer
        const unsigned char* w_rows = w + (size_t)blockIdx.x * BN * k_bytes;
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) mbar_wait_cluster(&empty[s], ((i / STAGES) & 1) ^ 1);
            const u32 bar = smem_u32(&full[s]), dst = smem_u32(stages) + s * STAGE;
            if (lane == 0)
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(bar), "r"((BN + (X ? 64 : 0)) * ROW_BYTES) : "memory");
            __syncwarp();
            for (int r = lane; r < BN; r += 32)
                bulk_copy(dst + r * PITCH, w_rows + r * k_bytes + i * ROW_BYTES, ROW_BYTES, bar);
#if X && MCAST
            for (int r = rank * (64 / CLUSTER) + lane; r < (rank + 1) * (64 / CLUSTER); r += 32)
                bulk_multicast(dst + W_STAGE + r * PITCH, x + r * k_bytes + i * ROW_BYTES, ROW_BYTES, bar,
                               (unsigned short)((1u << CLUSTER) - 1));
#elif X
            for (int r = lane; r < 64; r += 32)
                bulk_copy(dst + W_STAGE + r * PITCH, x + r * k_bytes + i * ROW_BYTES, ROW_BYTES, bar);
#endif
        }
    } else {
#if MATH
        // The product: warp v owns x's rows 16v..16v+15 (mma.m16n8k16's A, by ldmatrix.x4) against
        // all BN weight rows (B: two 8-row tiles a ldmatrix.x4), fp32 accumulators in registers.
        float acc_f[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) acc_f[j][0] = acc_f[j][1] = acc_f[j][2] = acc_f[j][3] = 0.f;
        const u32 a_row = 16 * warp + (lane & 15), a_col = (lane >> 4) * 16;  // bytes
        const u32 b_row = (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 16;
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            mbar_wait(&full[s], (i / STAGES) & 1);
            const u32 base = smem_u32(stages) + s * STAGE;
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                u32 a0, a1, a2, a3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(base + W_STAGE + a_row * PITCH + kk * 32 + a_col));
#pragma unroll
                for (int j = 0; j < BN / 8; j += 2) {
                    u32 b0, b1, b2, b3;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(base + (8 * j + b_row) * PITCH + kk * 32 + b_col));
                    mma_bf16(acc_f[j], a0, a1, a2, a3, b0, b1);
                    mma_bf16(acc_f[j + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            __syncwarp();
            free_stage(s, lane);
        }
        // D's rows are x's (m), its columns the weight rows (n): out[m][n0 + n] in bf16.
        unsigned short* y = reinterpret_cast<unsigned short*>(out);
        const int m = 16 * warp + (lane >> 2), n = blockIdx.x * BN + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            *reinterpret_cast<u32*>(y + (size_t)m * N + n + 8 * j) = pack_bf16(acc_f[j][0], acc_f[j][1]);
            *reinterpret_cast<u32*>(y + (size_t)(m + 8) * N + n + 8 * j) = pack_bf16(acc_f[j][2], acc_f[j][3]);
        }
#else
        // Each stage read once from shared memory, 16 bytes a thread a load.
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            mbar_wait(&full[s], (i / STAGES) & 1);
            const u32 base = smem_u32(stages) + s * STAGE;
            for (u32 o = threadIdx.x * 16; o < STAGE; o += WARPS * 32 * 16) {
                u32 a, b, c, d;
                asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(base + o));
                acc ^= a ^ b ^ c ^ d;
            }
            __syncwarp();
            free_stage(s, lane);
        }
#endif
    }
    if (!MATH && acc == 0x9e3779b9u) reinterpret_cast<u32*>(out)[blockIdx.x] = acc;  // keeps the loads
#if CLUSTER > 1
    cluster_sync();  // no program leaves while another may still copy into it or arrive on its barriers
#endif
}
"""

# Llama-3-8B's products at batch 64 as the table tiles them: (rows N, K, rows a program, stages),
# and the table's ring entry for each (the Gluon GEMM timed beside the walks; gate/up's entry is
# the split-K kernel, so its ring here is the ring's SwiGLU tile, one wave and a bit)
PRODUCTS = {"o": (4096, 4096, 32, 6), "qkv": (6144, 4096, 64, 5), "down": (4096, 14336, 32, 6),
            "gate/up": (28672, 4096, 128, 4)}
RING = {"o": dict(SUB=16, BLOCK_K=128, STAGES=6, WAVES=1), "qkv": dict(BLOCK_N=64, BLOCK_K=128, STAGES=4),
        "down": dict(BLOCK_N=64, BLOCK_K=128, STAGES=6, SPLIT_K=2), "gate/up": dict(BLOCK_N=128, BLOCK_K=128, STAGES=3)}
VARIANTS = {"weights": dict(X=0, CLUSTER=1, MCAST=0), "x": dict(X=1, CLUSTER=1, MCAST=0),
            "cluster 2": dict(X=1, CLUSTER=2, MCAST=0), "mcast 2": dict(X=1, CLUSTER=2, MCAST=1),
            "mcast 4": dict(X=1, CLUSTER=4, MCAST=1),
            # the same reads with the product (mma.sync from shared memory, bf16 out)
            "x, mma": dict(X=1, CLUSTER=1, MCAST=0, MATH=1), "mcast 2, mma": dict(X=1, CLUSTER=2, MCAST=1, MATH=1)}
BK, WARPS = 128, 4


def source(bn: int, stages: int, X: int, CLUSTER: int, MCAST: int, MATH: int = 0) -> str:
    """WALK specialised: the macros first, as cuda_gemv.py does."""
    if MCAST and (not X or CLUSTER < 2 or 64 % CLUSTER):
        raise ValueError(f"mcast needs x and a cluster of 2 or 4 programs, not X={X} CLUSTER={CLUSTER}")
    if MATH and (not X or bn % 16):
        raise ValueError(f"the product needs x and weight rows in 16s, not X={X} BN={bn}")
    defines = dict(BN=bn, BK=BK, STAGES=stages, WARPS=WARPS, X=X, CLUSTER=CLUSTER, MCAST=MCAST, MATH=MATH)
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + WALK


def stage_bytes(bn: int, X: int) -> int:
    return (bn + (64 if X else 0)) * (BK * 2 + 16)


def _operands(product: str):
    n, k = PRODUCTS[product][:2]
    copies = max(2, -(-512 * 2**20 // (n * k * 2)))
    ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(copies)]
    return ws, torch.randn(64, k, dtype=torch.bfloat16, device="cuda")


def walk_us(product: str, variant: str, reps: int, operands) -> tuple[float, float | None]:
    """(us a launch, and for a product its largest error against torch's over the output's largest)."""
    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels import cuda_runtime

    n, k, bn, stages = PRODUCTS[product]
    v = VARIANTS[variant]
    while stages > 2 and stages * stage_bytes(bn, v["X"]) > 220 * 1024:
        stages -= 1
    shared = stages * stage_bytes(bn, v["X"])
    ptx = cuda_runtime.compile_ptx(source(bn, stages, **v), "compute_90a")  # multicast wants sm_90a
    fn = cuda_runtime.load_ptx_function(ptx, "walk", torch.cuda.current_device(), shared)
    ws, x = operands
    out = torch.zeros(64, n, dtype=torch.bfloat16, device="cuda")

    def run(i: int) -> None:
        args = [ctypes.c_void_p(ws[i].data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                ctypes.c_int(n), ctypes.c_int(k)]
        cuda_runtime.launch(fn, n // bn, (WARPS + 1) * 32, shared, torch.cuda.current_stream().cuda_stream, args,
                            pdl=False)

    us = _time_graph_us(run, len(ws), reps)
    if not v.get("MATH"):
        return us, None
    run(0)
    ref = x.float() @ ws[0].float().T
    return us, ((out.float() - ref).abs().max() / ref.abs().max()).item()


def ring_us(product: str, reps: int, operands) -> float:
    """The table's Gluon ring GEMM for the product, alone, the same copies cycled."""
    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels import quant
    ws, x = operands
    glu = product == "gate/up"
    return _time_graph_us(lambda i: quant.ring_linear(x, ws[i], config=RING[product], glu=glu), len(ws), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--products", default=",".join(PRODUCTS), help="comma-separated, of " + ", ".join(PRODUCTS))
    ap.add_argument("--reps", type=int, default=24, help="launches a graph")
    ap.add_argument("--out", help="write the table as JSON here too")
    args = ap.parse_args()
    products = args.products.split(",")
    unknown = [p for p in products if p not in PRODUCTS]
    if unknown:
        ap.error(f"--products {','.join(unknown)}: not a product; choose from {', '.join(PRODUCTS)}")
    if not torch.cuda.is_available():
        sys.exit("multicast_probe needs a GPU (Hopper): none is visible")
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today()}\n$ {' '.join(sys.argv)}")
    names = list(VARIANTS) + ["ring (table)"]
    print("us a launch (weight GB/s)\n" + "product".ljust(10) + "".join(f"{v:>17}" for v in names))
    rows, errors = {}, {}
    for product in products:
        n, k = PRODUCTS[product][:2]
        operands = _operands(product)
        timed = {v: walk_us(product, v, args.reps, operands) for v in VARIANTS}
        rows[product] = {v: us for v, (us, _) in timed.items()} | {"ring (table)": ring_us(product, args.reps, operands)}
        errors[product] = {v: err for v, (_, err) in timed.items() if err is not None}
        del operands
        print(f"{product:<10}" + "".join(f"{us:>9.2f} ({n * k * 2 / us / 1e3:>5.0f})" for us in rows[product].values()),
              flush=True)
    print("the products' largest error over the output's largest (bf16 out):",
          json.dumps({p: {v: round(e, 5) for v, e in errs.items()} for p, errs in errors.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                       "command": " ".join(sys.argv), "us": rows, "errors": errors}, f, indent=1)


if __name__ == "__main__":
    main()
