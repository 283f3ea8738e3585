"""Would x multicast, or a K split inside a cluster, pay? The batch-64 products' reads, walked.

    python -m benchmarks.multicast_probe [--products o,qkv,down,gate/up] [--reps 24]

At 64 rows every program of a decode product reads all of x (64 x K, from L2) beside its own
weight rows: o's 32-row tiles take 2 bytes of x a weight byte, qkv's and down's 64-row tiles 1,
gate/up's 128 rows 0.5, and o's loop streams ~9.4 TB/s through L2 (docs/benchmarks-history.md, 2026-12-02 b).
Hopper can deliver one L2 read into the shared memory of every program of a cluster
(`cp.async.bulk ... .multicast::cluster`), which Gluon 3.6 does not expose; before a GEMM is built
on it, this kernel measures what it could buy. A CUDA C kernel (WALK below) reads what a product's
program reads, the way the ring GEMM does (a producer warp filling a ring of shared-memory stages,
consumer warps reading each stage once and freeing it; a stage is 128 columns of K, TMA boxes of
64 columns in 128-byte swizzle), and nothing else:

* weights: each program's BN rows, BK columns a stage (x not read): the floor for the walk;
* x: the same with the stage's x tile (64 rows) beside the weights, each program its own copy;
* mcast C: programs in clusters of C; each issues 64 / C of x's rows to all C programs at once,
  and a stage is refilled only once every program of the cluster has freed it;
* cluster C: clusters of C, each program still reading all of x (the cost of clustering alone);
* split 2: K split in two, each program twice the rows (SPLIT_ROWS) over half of K, so half of x;
  with "DSMEM sum" the pair is a cluster whose partial [64, rows] fp32 tiles are summed through
  distributed shared memory (each program sums half, `st.async` into the other's buffer);
* ..., mma / wgmma: the same reads with the product (mma.sync by ldmatrix, or wgmma through
  swizzled descriptors; bf16 out, checked against torch's), so the walk's rate can be set beside
  a real GEMM's; and the table's own Gluon ring GEMM for the product, alone (TABLE's batch-64
  entry; gate/up's entry is the split-K kernel, so its ring is RING_GATE_UP).

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
struct __align__(64) TensorMap { u64 bytes[16]; };  // a CUtensorMap, encoded on the host

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// A [rows, 64] box of a 2-D bf16 tensor (128-byte rows, 128-byte swizzle) at (k, row) into `dst`.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int k, int row, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" :: "r"(dst), "l"(map), "r"(k), "r"(row), "r"(bar) : "memory");
}
#if CLUSTER > 1
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// The same box into the same shared-memory offset of every program in the cluster (mask), each
// destination's barrier at `bar`'s offset counting its bytes.
__device__ __forceinline__ void tma_multicast(u32 dst, const TensorMap* map, int k, int row, u32 bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;" :: "r"(dst), "l"(map), "r"(k), "r"(row), "r"(bar), "h"(mask) : "memory");
}
// Arrive on the barrier at `bar`'s offset in program `cta` of the cluster.
__device__ __forceinline__ void arrive_remote(u32 bar, u32 cta) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
#define CLUSTER_ATTR __cluster_dims__(CLUSTER, 1, 1)
#else
#define CLUSTER_ATTR
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
// The 16-byte chunk c of row r in a 128-byte-swizzled box (rows of 128 bytes, 1024-byte aligned).
__device__ __forceinline__ u32 swizzled(u32 box, u32 r, u32 c) { return box + r * 128 + ((c ^ (r & 7)) << 4); }

#if MATH == 2
// A shared-memory matrix descriptor for wgmma: a K-major tile of 128-byte rows in 128-byte
// swizzle, 1024-byte aligned atoms of 8 rows (the stride), start address moved 32 bytes a 16-column step.
__device__ __forceinline__ u64 sw128_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
WGMMA_STEP
#endif

// A stage: the weights' two 64-column halves ([BN, 64] each), then x's ([64, 64] each).
#define W_STAGE (2 * BN * 128)
#define STAGE (W_STAGE + (X ? 2 * 64 * 128 : 0))

extern "C" __global__ void CLUSTER_ATTR __launch_bounds__((WARPS + 1) * 32)
walk(const __grid_constant__ TensorMap w_map, const __grid_constant__ TensorMap x_map, void* __restrict__ out,
     int N, int K)
{
    // STAGES stages, 1024-aligned, the barriers, and with DSUM the K half's partial sums received
    // from the other program of the cluster ([64, BN] fp32) and their barrier.
    extern __shared__ unsigned char smem[];
    const u32 stage0 = (smem_u32(smem) + 1023) & ~1023u;
    const u32 full0 = stage0 + STAGES * STAGE, empty0 = full0 + 8 * STAGES;
    const u32 recv0 = empty0 + 8 * STAGES, recv_bar = recv0 + 64 * BN * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, steps = K / 128 / KSPLIT;
#if CLUSTER > 1
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int part = KSPLIT > 1 ? rank : 0;
#else
    const int part = KSPLIT > 1 ? blockIdx.x % KSPLIT : 0;
#endif
    // K split: the programs of a split (a cluster with DSUM) walk one band of BN rows, each its
    // own K / KSPLIT columns.
    const int row0 = (blockIdx.x / KSPLIT) * BN, k0 = part * (K / KSPLIT);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full0 + 8 * s));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(empty0 + 8 * s), "r"(WARPS * (MCAST ? CLUSTER : 1)));
        }
        if (DSUM) {  // the receive barrier: its phase waits for the other program's half of the partials
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(recv_bar));
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(recv_bar), "r"(64 * BN * 2)
                         : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#if CLUSTER > 1
    cluster_sync();  // every program's barriers are set before any copy or arrive reaches them
#endif
    // A consumer warp done with stage s frees it, with multicast in every program of the cluster
    // (their producers write x into it).
    auto free_stage = [&](int s) {
#if CLUSTER > 1 && MCAST
        if (lane < CLUSTER) arrive_remote(empty0 + 8 * s, lane);
#else
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(empty0 + 8 * s) : "memory");
#endif
    };
    u32 acc = 0;
    if (warp == WARPS) {  // the producer: one lane issues a stage's four (or, multicast, 2 + 2) boxes
        if (lane == 0) {
            for (int i = 0; i < steps; ++i) {
                const int s = i % STAGES;
                if (i >= STAGES) mbar_wait(empty0 + 8 * s, ((i / STAGES) & 1) ^ 1);
                const u32 bar = full0 + 8 * s, dst = stage0 + s * STAGE;
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(bar), "r"(STAGE) : "memory");
                for (int h = 0; h < 2; ++h) {
                    tma_load(dst + h * BN * 128, &w_map, k0 + 128 * i + 64 * h, row0, bar);
#if X && MCAST
                    tma_multicast(dst + W_STAGE + h * 64 * 128 + rank * (64 / CLUSTER) * 128, &x_map, k0 + 128 * i + 64 * h,
                                  rank * (64 / CLUSTER), bar, (unsigned short)((1u << CLUSTER) - 1));
#elif X
                    tma_load(dst + W_STAGE + h * 64 * 128, &x_map, k0 + 128 * i + 64 * h, 0, bar);
#endif
                }
            }
        }
    } else {
#if MATH == 2
        // The product by wgmma: the four consumer warps are one warpgroup, x's 64 rows wgmma's M,
        // the BN weight rows its N, both operands read from the stage through 128-byte-swizzled
        // descriptors (K-major); a stage's eight 16-column products in one commit group, kept in
        // flight while the next stage's are issued, the stage freed once its group is done.
        float d[BN / 2];
#pragma unroll
        for (int e = 0; e < BN / 2; ++e) d[e] = 0.f;
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
            const u32 base = stage0 + s * STAGE;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                const u32 h = kk >> 2, off = 32 * (kk & 3);
                wgmma_step(d, sw128_desc(base + W_STAGE + h * 64 * 128 + off), sw128_desc(base + h * BN * 128 + off));
            }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            if (i > 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
                free_stage((i - 1) % STAGES);
            }
            wgmma_hold(d);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        wgmma_hold(d);
        free_stage((steps - 1) % STAGES);
        // d[4j + e]: row 16 warp + lane / 4 (+ 8 for e >= 2), column 8 j + 2 (lane % 4) + e % 2.
#if DSUM
        // The K split's sum in the cluster: the pair's threads hold the same fragments, so each
        // thread stores the 8-column tiles the other program sums (st.async into its slot of the
        // other's buffer, counted on its barrier), waits for its own and adds them in; program p
        // writes tiles [p HALF, (p + 1) HALF).
        constexpr int HALF = BN / 16;
        const int j_lo = part * HALF, j_hi = j_lo + HALF;
        {
            u32 remote, remote_bar;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(recv0 + threadIdx.x * BN), "r"(1 - part));
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(recv_bar), "r"(1 - part));
#pragma unroll
            for (int q = 0; q < HALF; ++q) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) v[e] = part ? d[4 * q + e] : d[4 * (HALF + q) + e];
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1,%2,%3,%4}, [%5];"
                             :: "r"(remote + 16 * q), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])),
                                "r"(__float_as_uint(v[2])), "r"(__float_as_uint(v[3])), "r"(remote_bar) : "memory");
            }
            mbar_wait(recv_bar, 0);
#pragma unroll
            for (int q = 0; q < HALF; ++q) {
                u32 a, b, c, e4;
                asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(e4)
                             : "r"(recv0 + threadIdx.x * BN + 16 * q));
                const float r[4] = {__uint_as_float(a), __uint_as_float(b), __uint_as_float(c), __uint_as_float(e4)};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (part) d[4 * (HALF + q) + e] += r[e];
                    else d[4 * q + e] += r[e];
                }
            }
        }
#else
        const int j_lo = 0, j_hi = BN / 8;
#endif
        unsigned short* y = reinterpret_cast<unsigned short*>(out);
        const int m = 16 * warp + (lane >> 2), n = row0 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            if (j < j_lo || j >= j_hi) continue;
            *reinterpret_cast<u32*>(y + (size_t)m * N + n + 8 * j) = pack_bf16(d[4 * j], d[4 * j + 1]);
            *reinterpret_cast<u32*>(y + (size_t)(m + 8) * N + n + 8 * j) = pack_bf16(d[4 * j + 2], d[4 * j + 3]);
        }
#elif MATH
        // The product: the warps split x's 64 rows MW ways (mma.m16n8k16's A, 16-row tiles by
        // ldmatrix.x4) and each stage's eight 16-column steps KW ways, every warp against all BN
        // weight rows (B: two 8-row tiles a ldmatrix.x4); at most 64 fp32 accumulators a thread,
        // so MT x NT independent products a step. The KW partial sums meet in shared memory.
        constexpr int MT = 4 / MW, NT = BN / 8;
        const int mw = warp % MW, kw = warp / MW;
        float acc_f[MT][NT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int j = 0; j < NT; ++j) acc_f[t][j][0] = acc_f[t][j][1] = acc_f[t][j][2] = acc_f[t][j][3] = 0.f;
        const u32 a_row = 16 * MT * mw + (lane & 15), a_chunk = lane >> 4;
        const u32 b_row = (lane >> 4) * 8 + (lane & 7), b_chunk = (lane >> 3) & 1;
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
            const u32 base = stage0 + s * STAGE;
#pragma unroll
            for (int kk = kw; kk < 8; kk += KW) {  // 16 columns: half kk / 4, chunks 2 (kk % 4) + 0..1
                const u32 h = kk >> 2, c = 2 * (kk & 3);
                u32 a[MT][4], b[NT][2];
#pragma unroll
                for (int t = 0; t < MT; ++t)
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(a[t][0]), "=r"(a[t][1]), "=r"(a[t][2]), "=r"(a[t][3])
                                 : "r"(swizzled(base + W_STAGE + h * 64 * 128, a_row + 16 * t, c + a_chunk)));
#pragma unroll
                for (int j = 0; j < NT; j += 2)
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1])
                                 : "r"(swizzled(base + h * BN * 128, 8 * j + b_row, c + b_chunk)));
#pragma unroll
                for (int t = 0; t < MT; ++t)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
                        mma_bf16(acc_f[t][j], a[t][0], a[t][1], a[t][2], a[t][3], b[j][0], b[j][1]);
            }
            __syncwarp();
            free_stage(s);
        }
        // Stage 0's memory is free now (every box this program asked for is in and read): the
        // k-split warps (kw > 0) leave their sums there, and warp kw 0 adds them in.
        float* part = reinterpret_cast<float*>(smem + (stage0 - smem_u32(smem)));
        if (KW > 1) {
            asm volatile("bar.sync 1, %0;" :: "r"(WARPS * 32) : "memory");  // every warp is past its last stage
            if (kw > 0) {
#pragma unroll
                for (int t = 0; t < MT; ++t)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            part[(((kw - 1) * MW + mw) * MT * NT * 4 + (t * NT + j) * 4 + e) * 32 + lane] = acc_f[t][j][e];
            }
            asm volatile("bar.sync 1, %0;" :: "r"(WARPS * 32) : "memory");
        }
        if (kw == 0) {
            for (int q = 1; q < KW; ++q)
#pragma unroll
                for (int t = 0; t < MT; ++t)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc_f[t][j][e] += part[(((q - 1) * MW + mw) * MT * NT * 4 + (t * NT + j) * 4 + e) * 32 + lane];
            // D's rows are x's (m), its columns the weight rows (n): out[m][n0 + n] in bf16.
            unsigned short* y = reinterpret_cast<unsigned short*>(out);
            const int n = blockIdx.x * BN + 2 * (lane & 3);
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                const int m = 16 * (MT * mw + t) + (lane >> 2);
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    *reinterpret_cast<u32*>(y + (size_t)m * N + n + 8 * j) = pack_bf16(acc_f[t][j][0], acc_f[t][j][1]);
                    *reinterpret_cast<u32*>(y + (size_t)(m + 8) * N + n + 8 * j) = pack_bf16(acc_f[t][j][2], acc_f[t][j][3]);
                }
            }
        }
#else
        // Each stage read once from shared memory, 16 bytes a thread a load.
        for (int i = 0; i < steps; ++i) {
            const int s = i % STAGES;
            mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
            const u32 base = stage0 + s * STAGE;
            for (u32 o = threadIdx.x * 16; o < STAGE; o += WARPS * 32 * 16) {
                u32 a, b, c, d;
                asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(base + o));
                acc ^= a ^ b ^ c ^ d;
            }
            __syncwarp();
            free_stage(s);
        }
#if DSUM
        // The K split's sum through distributed shared memory, each program summing half the
        // [64, BN] fp32 tile: it stores the half it does not sum into the other's receive buffer
        // with st.async, each store counted as bytes on the other's receive barrier (no fence at
        // cluster scope), then waits for the other's half and adds it in. (Call c8: one program
        // sending the whole tile, with release arrives, cost ~1 us over the split's walk; c9 the
        // same by st.async ~1.0.)
        {
            u32 remote, remote_bar;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(recv0), "r"(1 - part));
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(recv_bar), "r"(1 - part));
            for (u32 o = threadIdx.x * 16; o < 64 * BN * 2; o += WARPS * 32 * 16)
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1,%1,%1,%1}, [%2];"
                             :: "r"(remote + o), "r"(acc), "r"(remote_bar) : "memory");
            mbar_wait(recv_bar, 0);
            for (u32 o = threadIdx.x * 16; o < 64 * BN * 2; o += WARPS * 32 * 16) {
                u32 a, b, c, d;
                asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(recv0 + o));
                acc ^= a ^ b ^ c ^ d;
            }
        }
#endif
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
PRODUCTS = {"o": (4096, 4096, 32, 8), "qkv": (6144, 4096, 64, 6), "down": (4096, 14336, 32, 8),
            "gate/up": (28672, 4096, 128, 4)}
TABLE = "benchmarks/results/gemm-h200-decode.json"  # the H200 tune-gemm table: the ring's tiles at 64 rows
RING_GATE_UP = dict(BLOCK_N=128, BLOCK_K=128, STAGES=3)  # the ring's SwiGLU tile (the table runs split-K there)
VARIANTS = {"weights": dict(X=0, CLUSTER=1, MCAST=0), "x": dict(X=1, CLUSTER=1, MCAST=0),
            "cluster 2": dict(X=1, CLUSTER=2, MCAST=0), "mcast 2": dict(X=1, CLUSTER=2, MCAST=1),
            "mcast 4": dict(X=1, CLUSTER=4, MCAST=1),
            # K split in two: each program twice the rows over half of K (SPLIT_ROWS), so half the x;
            # the halves' sums left unsummed, or summed through the cluster's shared memory
            "split 2": dict(X=1, CLUSTER=1, MCAST=0, KSPLIT=2), "split 2, DSMEM sum": dict(X=1, CLUSTER=2, MCAST=0, KSPLIT=2, DSUM=1),
            # the same reads with the product (mma.sync from shared memory, bf16 out)
            "x, mma": dict(X=1, CLUSTER=1, MCAST=0, MATH=1),
            # ... and by wgmma (MATH 2), x per program or multicast
            "x, wgmma": dict(X=1, CLUSTER=1, MCAST=0, MATH=2), "mcast 2, wgmma": dict(X=1, CLUSTER=2, MCAST=1, MATH=2),
            "mcast 4, wgmma": dict(X=1, CLUSTER=4, MCAST=1, MATH=2),
            "split 2, DSMEM sum, wgmma": dict(X=1, CLUSTER=2, MCAST=0, KSPLIT=2, DSUM=1, MATH=2)}
SPLIT_ROWS = {"o": 64, "qkv": 96, "down": 64}  # a split band's rows: two programs a band, 128 in all
BK, WARPS = 128, 4  # K columns a stage (two 64-column boxes), consumer warps


def source(bn: int, stages: int, X: int, CLUSTER: int, MCAST: int, MATH: int = 0, KSPLIT: int = 1,
           DSUM: int = 0) -> str:
    """WALK specialised: the macros first, as cuda_gemv.py does."""
    if DSUM and (KSPLIT != 2 or CLUSTER != 2 or MATH == 1 or bn % 16):
        raise ValueError(f"the DSMEM sum is of a K split in two over a cluster of 2, the walk's or the wgmma product's, "
                         f"rows in 16s, not KSPLIT={KSPLIT} CLUSTER={CLUSTER} MATH={MATH} BN={bn}")
    if MCAST and (not X or CLUSTER < 2 or 64 % CLUSTER):
        raise ValueError(f"mcast needs x and a cluster of 2 or 4 programs, not X={X} CLUSTER={CLUSTER}")
    if MATH and (not X or bn % 16):
        raise ValueError(f"the product needs x and weight rows in 16s, not X={X} BN={bn}")
    mw = min(4, max(1, bn // 32))  # x's rows split so that a thread holds 4 x 32 / BN ... 64 accumulators
    src = WALK.replace("WGMMA_STEP", _wgmma_step(bn) if MATH == 2 else "")
    defines = dict(BN=bn, STAGES=stages, WARPS=WARPS, X=X, CLUSTER=CLUSTER, MCAST=MCAST, MATH=MATH, MW=mw,
                   KW=WARPS // mw, KSPLIT=KSPLIT, DSUM=DSUM)
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + src


def _wgmma_step(bn: int) -> str:
    """wgmma_step (one m64n{bn}k16 product into bn / 2 fp32 accumulators a thread, both operands
    from shared memory) and wgmma_hold (the accumulators pinned across the asynchronous
    products): their asm needs every register named, so it is written out here."""
    regs = bn // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    binds = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return (f"__device__ __forceinline__ void wgmma_step(float* d, u64 a, u64 b) {{\n"
            f'    asm volatile("wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16 {{{outs}}}, %{regs}, %{regs + 1}, 1, 1, 1, 0, 0;"\n'
            f'                 : {binds} : "l"(a), "l"(b) : "memory");\n}}\n'
            f"__device__ __forceinline__ void wgmma_hold(float* d) {{\n"
            f'    asm volatile("" : {binds} :: "memory");\n}}\n')


def stage_bytes(bn: int, X: int) -> int:
    """A stage's shared memory: the weights' [BN, 128] and x's [64, 128] as two 64-column boxes each."""
    return 2 * (bn + (64 if X else 0)) * 128


def _operands(product: str):
    from benchmarks.read_floor import _copies
    n, k = PRODUCTS[product][:2]
    copies = _copies(n * k * 2)
    ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(copies)]
    return ws, torch.randn(64, k, dtype=torch.bfloat16, device="cuda")


def walk_us(product: str, variant: str, reps: int, operands) -> tuple[float, float | None]:
    """(us a launch, and for a product its largest error against torch's over the output's largest)."""
    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels import cuda_runtime

    n, k, bn, stages = PRODUCTS[product]
    v = VARIANTS[variant]
    split = v.get("KSPLIT", 1)
    if split > 1:
        if product not in SPLIT_ROWS:
            return float("nan"), None
        bn = SPLIT_ROWS[product]
    recv = 64 * bn * 4 + 16 if v.get("DSUM") else 0
    while stages > 2 and stages * stage_bytes(bn, v["X"]) + recv > 210 * 1024:
        stages -= 1
    shared = stages * stage_bytes(bn, v["X"]) + 1024 + 16 * stages + recv  # 1024-byte alignment, the barriers
    ptx = cuda_runtime.compile_ptx(source(bn, stages, **v), "compute_90a")  # multicast wants sm_90a
    fn = cuda_runtime.load_ptx_function(ptx, "walk", torch.cuda.current_device(), shared)
    ws, x = operands
    w_maps = [cuda_runtime.tensor_map(w, bn, 64) for w in ws]
    x_map = cuda_runtime.tensor_map(x, 64 // v["CLUSTER"] if v["MCAST"] else 64, 64)
    out = torch.zeros(64, n, dtype=torch.bfloat16, device="cuda")

    def run(i: int) -> None:
        args = [w_maps[i], x_map, ctypes.c_void_p(out.data_ptr()), ctypes.c_int(n), ctypes.c_int(k)]
        cuda_runtime.launch(fn, n // bn * split, (WARPS + 1) * 32, shared, torch.cuda.current_stream().cuda_stream, args,
                            pdl=False)

    us = _time_graph_us(run, len(ws), reps)
    if not v.get("MATH"):
        return us, None
    run(0)
    ref = x.float() @ ws[0].float().T
    return us, ((out.float() - ref).abs().max() / ref.abs().max()).item()


def ring_config(product: str) -> dict:
    """The ring tile the step runs for the product at 64 rows: TABLE's entry (RING_GATE_UP for gate/up)."""
    if product == "gate/up":
        return RING_GATE_UP
    n, k = PRODUCTS[product][:2]
    with open(TABLE) as f:
        entry = json.load(f)["entries"][f"{n}x{k}:bfloat16:bfloat16"]["64"]
    if entry["impl"] != "ring":
        raise ValueError(f"{TABLE}: {product} at 64 rows runs {entry['impl']}, not the ring; set its tile here")
    return entry["config"]


def ring_us(product: str, reps: int, operands) -> float:
    """The table's Gluon ring GEMM for the product, alone, the same copies cycled."""
    from shardline.gemm_tuning import _time_graph_us
    from shardline.kernels import quant
    ws, x = operands
    cfg, glu = ring_config(product), product == "gate/up"
    return _time_graph_us(lambda i: quant.ring_linear(x, ws[i], config=cfg, glu=glu), len(ws), reps)


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
    if args.reps < 1:
        ap.error(f"--reps {args.reps}: launches a graph, at least 1")
    if not torch.cuda.is_available():
        sys.exit("multicast_probe needs a GPU (Hopper): none is visible")
    if torch.cuda.get_device_capability() < (9, 0):
        sys.exit(f"multicast_probe needs a Hopper GPU (TMA boxes, clusters, wgmma): {torch.cuda.get_device_name()} "
                 f"is sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    print(f"{torch.cuda.get_device_name()}  {datetime.date.today()}\n$ {' '.join(sys.argv)}")
    names = list(VARIANTS) + ["ring (table)"]
    widths = [max(17, len(v) + 2) for v in names]
    print("us a launch (weight GB/s)\n" + "product".ljust(10) + "".join(f"{v:>{w}}" for v, w in zip(names, widths)))
    rows, errors = {}, {}
    for product in products:
        n, k = PRODUCTS[product][:2]
        operands = _operands(product)
        timed = {v: walk_us(product, v, args.reps, operands) for v in VARIANTS}
        rows[product] = {v: us for v, (us, _) in timed.items()} | {"ring (table)": ring_us(product, args.reps, operands)}
        errors[product] = {v: err for v, (_, err) in timed.items() if err is not None}
        del operands
        cells = [f"{us:.2f} ({n * k * 2 / us / 1e3:>5.0f})" for us in rows[product].values()]
        print(f"{product:<10}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)), flush=True)
    print("the products' largest error over the output's largest (bf16 out):",
          json.dumps({p: {v: round(e, 5) for v, e in errs.items()} for p, errs in errors.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                       "command": " ".join(sys.argv), "us": rows, "errors": errors}, f, indent=1)


if __name__ == "__main__":
    main()
