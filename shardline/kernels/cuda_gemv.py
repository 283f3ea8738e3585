"""CUDA C GEMV for decode at batch 1 (CuPy compiles it with NVRTC), the same fused op as
triton_gemv.py: optional residual add + RMSNorm before the product, optional SwiGLU after, int8
or fp8 weights with a per-row scale. Beyond the Triton kernel, for GPT-2/GPT-J-style layers:
LayerNorm with its bias (LN) in place of RMSNorm, GELU after the product (GELU), and another
product's output added to this one's before its bias (ADD: a parallel residual's two partials).

A batch-1 decode step is a weight stream, and the time it loses is at the edges of ~130 short
kernels. Three forms of one kernel, picked by the tiles (`resolve_tiles`):

- BULK (the default): a persistent grid whose producer warp streams each block's rows into a
  ring of shared-memory stages with `cp.async.bulk`, and whose consumer warps hold their slice
  of x in registers; launched with programmatic dependent launch, the next GEMV fills its ring
  while this one drains; x is loaded after all but the first PRE stages are issued, so it does
  not queue behind the whole ring. Its consumers multiply with FFMA (int8 weights with dp4a), or
  with tensor cores (BULK and MMA). Measured on the H200 (docs/benchmarks-history.md): the batch-1 stack
  at 4.4 TB/s in bf16 and 4.1 in int8, against 3.7 and 3.1 for the FFMA form.
- FFMA: one warp owns ROWS output rows (both the gate and the up row with GLU) and walks K in
  16-byte loads that bypass L1 (`ld.global.nc.L1::no_allocate`), UNROLL chunks per row in
  flight, x staged once per block in shared memory as fp32; BLOCKS > 0 makes the grid persistent.
- MMA: a block owns 16 rows of the mma.m16n8k16 A operand and its warps split K.

Programmatic dependent launch (Hopper): each form loads its first weights before
`griddepcontrol.wait`. It is on by default for the bulk form only: it made the FFMA form's stack
14-27% slower (why is not established), the bulk form's 9% faster. CuPy's launcher cannot set
the launch attribute, so the launch goes through the driver's `cuLaunchKernelEx` (cuda_runtime.py).

Widening: int8 by the float trick (0x4B000000 | (q + 128) is 2^23 + 128 + q as fp32), fp8 e4m3 by
the hardware pair conversion to fp16; the bulk form's int8 default skips it (dp4a on x as 16-bit
fixed point, `to_fixed16`). Rounding follows triton_gemv.py (and so the unfused path):
x + residual is rounded to x's dtype, the normed input stays fp32, the gate, silu and up values
are rounded where the unfused kernels round them.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import cuda_runtime
from ._dispatch import hopper_or_later, sm_count, use_gemv_pdl

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ float x2f(u16 h) {
#if X_FP16
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
    return __uint_as_float(((u32)h) << 16);
#endif
}
__device__ __forceinline__ u16 f2x(float f) {
    u16 h;
#if X_FP16
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return h;
}
__device__ __forceinline__ float round_x(float f) { return x2f(f2x(f)); }

// GPT-2/GPT-J's GELU ("gelu_new"): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in fp32.
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Elements of x (and of a weight chunk) per 16-byte weight chunk.
#if W_BYTES == 1
#define EPC 16
#else
#define EPC 8
#endif

// Weight element e (0 .. EPC-1) of a 16-byte chunk, as fp32 (before the row scale).
__device__ __forceinline__ float widen(const uint4& w, int e) {
    const int i = e / (EPC / 4);
    const u32 word = i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
#if W_BYTES == 1
    const int b = e & 3;
#if W_FP8
    u32 h2; const u16 pair = (u16)(word >> (16 * (b >> 1)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    float f; const u16 h = (u16)(h2 >> (16 * (b & 1)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // 0x4B000000 | (q + 128) is the fp32 2^23 + 128 + q.
    return __uint_as_float(__byte_perm(word ^ 0x80808080u, 0x4B000000u, 0x7540u | b)) - 8388736.0f;
#endif
#else
    return x2f((u16)(word >> (16 * (e & 1))));
#endif
}

// Eight 16-bit values of x's dtype <-> fp32.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
    const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = x2f((u16)(words[i] & 0xffffu));
        f[2 * i + 1] = x2f((u16)(words[i] >> 16));
    }
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    u32 words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) words[i] = (u32)f2x(f[2 * i]) | ((u32)f2x(f[2 * i + 1]) << 16);
    return make_uint4(words[0], words[1], words[2], words[3]);
}

// h = x (+ residual, rounded to x's dtype as the unfused add rounds): elements 8q .. 8q + 7.
__device__ __forceinline__ void load_h(const uint4* __restrict__ x, const uint4* __restrict__ res, int q,
                                       float* v) {
    unpack8(x[q], v);
    if (HAS_RES) {
        float r[8];
        unpack8(res[q], r);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = round_x(v[i] + r[i]);
    }
}

// One output from its row's sum y (and with GLU the up row's sum up): times the row's scale, plus
// its bias (scale[i], bias[i] for the gate or plain row, [i_up] for the up row), then SwiGLU or
// GELU, rounded where the unfused kernels round. scale and bias may live in global or shared
// memory. With ADD, `a` (the output's addend, in x's dtype) goes on before the bias, in the
// unfused order: the product rounded, the partial sums added and rounded, then the bias.
__device__ __forceinline__ u16 finish_output(float y, float up, const u16* scale, const u16* bias, int i, int i_up,
                                             float a) {
    if (HAS_SCALE) y *= x2f(scale[i]);
    if (ADD) {
        y = round_x(round_x(y) + a);
        if (HAS_BIAS) y += x2f(bias[i]);
        return f2x(y);
    }
    if (HAS_BIAS) y += x2f(bias[i]);
    if (GLU) {
        if (HAS_SCALE) up *= x2f(scale[i_up]);
        if (HAS_BIAS) up += x2f(bias[i_up]);
        const float g = round_x(y);
        y = round_x(g / (1.f + __expf(-g))) * round_x(up);
    } else if (GELU) {
        y = gelu_tanh(round_x(y));
    }
    return f2x(y);
}

// A sum over the block in two halves, for callers that sync the block anyway: each warp's total
// of v into red[warp]; then, after a __syncthreads, red_total adds the nwarps entries up.
__device__ __forceinline__ void warp_sum_to(float v, float* red) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
}

__device__ __forceinline__ float red_total(const float* red, int nwarps) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < nwarps; ++i) total += red[i];
    return total;
}

// A sum over the block's nwarps warps, through red[] (nwarps floats; free again on return).
__device__ __forceinline__ float block_sum(float v, float* red, int nwarps) {
    warp_sum_to(v, red);
    __syncthreads();
    const float total = red_total(red, nwarps);
    __syncthreads();
    return total;
}

#if LN
// LayerNorm's statistics of h = x (+ residual) over its K values, by all the block's threads: the
// mean, then 1 / sqrt(the variance about it + eps) (two passes, as the unfused kernel sums).
__device__ __forceinline__ void ln_stats(const uint4* __restrict__ x, const uint4* __restrict__ res, int K, float eps,
                                         float* red, float& mean, float& rstd) {
    const int nwarps = blockDim.x >> 5;
    float sum = 0.f;
    for (int q = threadIdx.x; q < K / 8; q += blockDim.x) {
        float v[8];
        load_h(x, res, q, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += v[i];
    }
    mean = block_sum(sum, red, nwarps) / K;
    float sq = 0.f;
    for (int q = threadIdx.x; q < K / 8; q += blockDim.x) {
        float v[8];
        load_h(x, res, q, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) sq = fmaf(v[i] - mean, v[i] - mean, sq);
    }
    rstd = rsqrtf(block_sum(sq, red, nwarps) / K + eps);
}
#endif

#if !MMA && !BULK
#define NW (ROWS * (GLU ? 2 : 1))

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, const uint4* __restrict__ res,
     const uint4* __restrict__ norm_w, uint4* __restrict__ res_out, const u16* __restrict__ scale,
     const u16* __restrict__ bias, u16* __restrict__ out, int N, int K, float eps,
     const uint4* __restrict__ norm_b, const u16* __restrict__ add)
{
    // x as the product reads it (fp32, after the residual add and norm weight), stored so that
    // float4 j of 16-byte chunk c sits at xs[j * chunks + c]: lanes read consecutive float4s.
    extern __shared__ float4 xs[];
    __shared__ float partial_sq[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = K / EPC;
    const int groups = (N + WARPS * ROWS - 1) / (WARPS * ROWS);  // of WARPS * ROWS rows

    const uint4* rows[NW];
    uint4 wv[UNROLL][NW];
#define SET_ROWS(group)                                                           \
    _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                            \
        const int n = min(((group) * WARPS + warp) * ROWS + r, N - 1);            \
        rows[r] = w + (size_t)n * chunks;                                         \
        if (GLU) rows[NW - ROWS + r] = w + (size_t)(N + n) * chunks;              \
    }
#define LOAD_WEIGHTS(c0)                                                          \
    _Pragma("unroll") for (int u = 0; u < UNROLL; ++u) {                          \
        const int c = (c0) + 32 * u;                                              \
        _Pragma("unroll") for (int r = 0; r < NW; ++r)                            \
            wv[u][r] = c < chunks ? load_stream(rows[r] + c) : make_uint4(0, 0, 0, 0); \
    }

    int group = blockIdx.x;
    SET_ROWS(group)
    LOAD_WEIGHTS(lane)  // independent of the kernel before: streams before the wait
#if USE_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    float sum_sq = 0.f;
#if LN
    // LayerNorm: x is stored normed (and rounded, as the unfused norm's output), so the sums need
    // no rstd after.
    float mean, ln_rstd;
    ln_stats(x, res, K, eps, partial_sq, mean, ln_rstd);
#endif
    for (int q = threadIdx.x; q < K / 8; q += WARPS * 32) {
        float v[8];
        load_h(x, res, q, v);
        if (HAS_RES && blockIdx.x == 0) res_out[q] = pack8(v);
        if (NORM) {
            float g[8];
            unpack8(norm_w[q], g);
#if LN
            float b[8];
            unpack8(norm_b[q], b);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = round_x(fmaf((v[i] - mean) * ln_rstd, g[i], b[i]));
#else
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                sum_sq = fmaf(v[i], v[i], sum_sq);
                v[i] *= g[i];
            }
#endif
        }
        const int c = q / (EPC / 8), j = 2 * (q % (EPC / 8));
        xs[j * chunks + c] = make_float4(v[0], v[1], v[2], v[3]);
        xs[(j + 1) * chunks + c] = make_float4(v[4], v[5], v[6], v[7]);
    }
    float rstd = 1.f;
    if (NORM && !LN) warp_sum_to(sum_sq, partial_sq);
    __syncthreads();  // xs written, and the squares' warp sums
    if (NORM && !LN) rstd = rsqrtf(red_total(partial_sq, WARPS) / K + eps);

    for (;;) {
        float acc[NW];
#pragma unroll
        for (int r = 0; r < NW; ++r) acc[r] = 0.f;
        for (int c0 = lane;;) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int c = c0 + 32 * u;
                if (c >= chunks) break;
                float xf[EPC];
#pragma unroll
                for (int j = 0; j < EPC / 4; ++j) {
                    const float4 v = xs[j * chunks + c];
                    xf[4 * j] = v.x; xf[4 * j + 1] = v.y; xf[4 * j + 2] = v.z; xf[4 * j + 3] = v.w;
                }
#pragma unroll
                for (int r = 0; r < NW; ++r)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) acc[r] = fmaf(widen(wv[u][r], e), xf[e], acc[r]);
#if PIPE
                // Rolling: refill the slot just used with the chunk UNROLL slots ahead, so
                // UNROLL - 1 loads per row stay in flight through the whole row.
                const int ahead = c + 32 * UNROLL;
#pragma unroll
                for (int r = 0; r < NW; ++r)
                    wv[u][r] = ahead < chunks ? load_stream(rows[r] + ahead) : make_uint4(0, 0, 0, 0);
#endif
            }
            c0 += 32 * UNROLL;
            if (c0 >= chunks) break;
#if !PIPE
            LOAD_WEIGHTS(c0)  // batched: all UNROLL chunks of the next step at once
#endif
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int r = 0; r < NW; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int n = (group * WARPS + warp) * ROWS + r;
            if (lane != r || n >= N) continue;
            out[n] = finish_output(acc[r] * rstd, acc[NW - ROWS + r] * rstd, scale, bias, n, N + n,
                                   ADD ? x2f(add[n]) : 0.f);
        }
        group += gridDim.x;
        if (group >= groups) break;
        SET_ROWS(group)
        LOAD_WEIGHTS(lane)
    }
}
#endif  // !MMA && !BULK


#if MMA
// Tensor-core helpers, for the MMA form and the bulk form's MMA consumers. The widening is one or
// two instructions per pair of weights (int8: byte_perm into the fp16 magic 1024 + (q + 128),
// then one f16x2 subtract), against three per weight with FFMA. int8 and fp8 multiply in fp16:
// an activation beyond fp16's range (65504) is not representable.
#if W_BYTES == 2 && !X_FP16
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif
#define KSTEP (4 * EPC)  // k per warp step: four lanes of 16 bytes per row

__device__ __forceinline__ u32 to_mma_pair(float lo, float hi) {
    u32 r;
#if W_BYTES == 2 && !X_FP16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// Pair p (0 .. EPC/2 - 1) of a 16-byte weight chunk as the MMA's half2 type (before the scale).
__device__ __forceinline__ u32 weight_pair(const uint4& w, int p) {
#if W_BYTES == 2
    return p == 0 ? w.x : p == 1 ? w.y : p == 2 ? w.z : w.w;
#else
    const u32 word = (p >> 1) == 0 ? w.x : (p >> 1) == 1 ? w.y : (p >> 1) == 2 ? w.z : w.w;
#if W_FP8
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)(word >> (16 * (p & 1)))));
    return h2;
#else
    // fp16 0x64XX is 1024 + XX; XX = q + 128, so subtracting 1152 (0x6480) leaves q exactly.
    const u32 magic = __byte_perm(word ^ 0x80808080u, 0x64646464u, (p & 1) ? 0x7362u : 0x5140u);
    u32 h2;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(h2) : "r"(magic), "r"(0x64806480u));
    return h2;
#endif
#endif
}

__device__ __forceinline__ void mma_16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#endif  // MMA helpers

#if BULK
// Bulk-copy form: the weight stream leaves the registers. A persistent block (BLOCKS per
// multiprocessor) owns a contiguous run of row groups, ROWS rows each (and their ROWS up rows
// with GLU); a producer warp streams each group into a ring of STAGES shared-memory stages with
// `cp.async.bulk` (the copy engine: one instruction per run of rows, evicting first from L2),
// and WARPS consumer warps split K between them, each lane holding its chunks of x in registers
// for the whole kernel. A consumer leaves one partial sum per row and stage; the producer sums
// the warps' partials and writes the outputs (scale, bias, SwiGLU) while the next stages stream.
// mbarriers: full[s] counts the stage's bytes in, empty[s] the warps done with it.
//
// The consumers' product, by MMA:
//   0 (FFMA): lane l of warp v owns chunks l + 32 (v + WARPS i), i < CPL, with x in fp32 after
//     the norm weight (rstd is applied to the sum); per stage, CPL shared loads and EPC FMAs per
//     row (int8 with DP4A: 8 dp4a, a conversion and one FMA), then a reduction over the lanes.
//   1 (tensor cores): the stage's rows (MMA_ROWS: NR rounded up to a power of two, at least 2)
//     times SEGS = 16 / MMA_ROWS segments of K are the 16 rows of the mma.m16n8k16 A operand:
//     A row m is stage row m / SEGS over segment m % SEGS, so lane (g, t) = (lane / 4, lane % 4)
//     holds rows g / SEGS and (g + 8) / SEGS of segment g % SEGS. B's column n is segment n of x
//     (columns SEGS.. are unused), so D[m][m % SEGS] is row m / SEGS's sum over that segment, and
//     the rest of D is discarded. Lanes of one segment load the same chunks (their B column is
//     the one the MMA pairs them with). A warp step covers 4 chunks of each segment (lane t takes
//     one), steps go round the warps (CPL per lane), and odd segments run a step ahead so that
//     the groups' shared loads fall in different banks. x is B in the MMA's half type, normed and
//     rounded as the unfused path rounds it. Widening int8 costs one instruction a weight,
//     against three with FFMA.
#define NR (ROWS * (GLU ? 2 : 1))
#define NR_POW2 (NR <= 1 ? 1 : NR <= 2 ? 2 : NR <= 4 ? 4 : NR <= 8 ? 8 : 16)
#define MMA_ROWS (NR_POW2 < 2 ? 2 : NR_POW2)
#define SEGS (16 / MMA_ROWS)
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
#if TRACE
// A measuring knob: each block's timeline, TRACE_SLOTS stamps a block (`trace_of` reads them):
// 0 global time at entry (ns), then its multiprocessor's clock at 1 entry, 2 past the wait for
// the kernel before, 3 the consumers' first stage wait, 4 the first stage in, 5 the last stage
// in, 6 the last stage done (consumer warp 0), 7 the producer's end, and 8 global time there.
#define TRACE_SLOTS 9
__device__ unsigned long long gemv_trace[4096 * TRACE_SLOTS];
__device__ __forceinline__ void stamp(int slot) {
    unsigned long long t;
    if (slot == 0 || slot == 8) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    else asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    if (blockIdx.x < 4096) gemv_trace[blockIdx.x * TRACE_SLOTS + slot] = t;
}
#else
__device__ __forceinline__ void stamp(int) {}
#endif
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

// int8 weights by dp4a (XQ): a consumer holds each chunk of x as 16-bit fixed point under a
// power-of-two scale (2^(E - 15), with every |x| < 2^E), split into a signed high byte and an
// unsigned low byte, so that 8 dp4a give a row's exact integer dot product with the chunk: 11
// instructions for 16 weights, where widening and FFMA take three a weight. Exact for a chunk
// whose values span under 2^7 (x's dtype has 8 significant bits); otherwise each value is off by
// at most half the unit, 2^(E - 16): under 2^-15 of the chunk's largest.
#define XQ (DP4A && W_BYTES == 1 && !W_FP8 && !MMA)
#if XQ
__device__ __forceinline__ float to_fixed16(const float* f, u32* words) {
    float m = 0.f;
#pragma unroll
    for (int e = 0; e < 16; ++e) m = fmaxf(m, fabsf(f[e]));
    const int E = max(-100, (int)((__float_as_uint(m) >> 23) & 0xff) - 126);  // m < 2^E
    const float up = __uint_as_float((u32)(127 + 15 - E) << 23);
    u32 q[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {  // round(f * up): 1.5 * 2^23 + v holds v's nearest integer (|v| < 2^22)
        const int v = (int)__float_as_uint(fmaf(f[e], up, 12582912.f)) - 0x4B400000;
        q[e] = (u32)min(32767, max(-32767, v));  // where f * up rounds up to 2^15
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bytes 1 (high) and 0 (low) of 4 values into a word each
        const u32 t01 = __byte_perm(q[4 * i], q[4 * i + 1], 0x5140), t23 = __byte_perm(q[4 * i + 2], q[4 * i + 3], 0x5140);
        words[i] = __byte_perm(t01, t23, 0x7632);
        words[4 + i] = __byte_perm(t01, t23, 0x5410);
    }
    return __uint_as_float((u32)(127 - 15 + E) << 23);
}
__device__ __forceinline__ int dp4a_ss(u32 a, u32 b, int c) {
    int d; asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ __forceinline__ int dp4a_su(u32 a, u32 b, int c) {
    int d; asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
// Sum over a 16-byte chunk of int8 weights w and x's fixed-point chunk: |sum| < 2^31.
__device__ __forceinline__ int dot16_fixed(const uint4& w, const u32* xq) {
    int hi = dp4a_ss(w.x, xq[0], 0);
    hi = dp4a_ss(w.y, xq[1], hi);
    hi = dp4a_ss(w.z, xq[2], hi);
    hi = dp4a_ss(w.w, xq[3], hi);
    int lo = dp4a_su(w.x, xq[4], hi * 256);
    lo = dp4a_su(w.y, xq[5], lo);
    lo = dp4a_su(w.z, xq[6], lo);
    return dp4a_su(w.w, xq[7], lo);
}
#endif

// Steps of a consumer warp's round: 32 chunks (FFMA), or 4 chunks of each of the SEGS segments (MMA).
__device__ __forceinline__ int round_steps(int chunks) {
#if MMA
    return ((chunks + SEGS - 1) / SEGS + 3) / 4;
#else
    return (chunks + 31) / 32;
#endif
}

// The chunk (16 bytes of a weight row, EPC elements of x) that this lane takes in round i, or -1.
__device__ __forceinline__ int lane_chunk(int i, int lane, int warp, int chunks) {
    const int step = warp + WARPS * i;
#if MMA
    const int sg = (lane >> 2) % SEGS, seg = (chunks + SEGS - 1) / SEGS, steps = (seg + 3) / 4;
    if (step >= steps) return -1;
    const int c = 4 * ((step + (sg & 1)) % steps) + (lane & 3);
    return c < min(seg, chunks - sg * seg) ? sg * seg + c : -1;
#else
    const int c = lane + 32 * step;
    return c < chunks ? c : -1;
#endif
}

extern "C" __global__ void __launch_bounds__((WARPS + 1) * 32)
gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, const uint4* __restrict__ res,
     const uint4* __restrict__ norm_w, uint4* __restrict__ res_out, const u16* __restrict__ scale,
     const u16* __restrict__ bias, u16* __restrict__ out, int N, int K, float eps,
     const uint4* __restrict__ norm_b, const u16* __restrict__ add)
{
    extern __shared__ __align__(128) unsigned char stages[];  // STAGES x NR rows of K weights, row params
    __shared__ u64 full[STAGES], empty[STAGES];
    __shared__ float partial[STAGES][2][WARPS][NR];  // [stage][pass parity][warp][row]
    __shared__ float partial_sq[WARPS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 row_bytes = (u32)K * W_BYTES, stage_bytes = NR * row_bytes;
    const int chunks = K / EPC, steps = round_steps(chunks);
    const int groups = (N + ROWS - 1) / ROWS;
    const int g_lo = (int)((long long)blockIdx.x * groups / gridDim.x);
    const int count = (int)((long long)(blockIdx.x + 1) * groups / gridDim.x) - g_lo;
    const u32 stage0 = smem_u32(stages);

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(&empty[s])), "r"(WARPS));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    u64 policy = 0;
    // Group i of this block into its stage: ROWS rows, and with GLU the ROWS up rows N below.
    auto issue = [&](int i) {
        const int s = i % STAGES, n0 = (g_lo + i) * ROWS;
        const u32 bytes = (u32)min(ROWS, N - n0) * row_bytes;
        const u32 dst = stage0 + s * stage_bytes, bar = smem_u32(&full[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"((GLU ? 2 : 1) * bytes)
                     : "memory");
        const unsigned char* src = reinterpret_cast<const unsigned char*>(w) + (size_t)n0 * row_bytes;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                     " [%0], [%1], %2, [%3], %4;" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
        if (GLU) {
            src += (size_t)N * row_bytes;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                         " [%0], [%1], %2, [%3], %4;" :: "r"(dst + ROWS * row_bytes), "l"(src), "r"(bytes), "r"(bar),
                         "l"(policy) : "memory");
        }
    };
    // Before the wait for the kernel before, what does not depend on it: the producer streams the
    // first PRE stages, the consumers load the block's row scales and biases (gate then up with
    // GLU) into shared memory, for the producer's epilogue, and their chunks of the norm weight.
    // x is loaded after the wait, behind only those stages: a load waits behind the weight bytes
    // already in flight to its multiprocessor (the H200 block timelines in docs/benchmarks-history.md),
    // so the rest of the ring is issued once x is in.
    if (warp == WARPS && lane == 0) {
        stamp(0), stamp(1);
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        for (int i = 0; i < min(PRE, count); ++i) issue(i);
    }
    const int n_lo = g_lo * ROWS, n_rows = min(count * ROWS, N - n_lo);
    u16* const row_params = reinterpret_cast<u16*>(stages + STAGES * stage_bytes);  // [scale | bias][GLU][n_rows]
    const int params_stride = (GLU ? 2 : 1) * n_rows;
    if ((HAS_SCALE || HAS_BIAS) && warp < WARPS) {
        for (int j = threadIdx.x; j < params_stride; j += WARPS * 32) {
            const int n = j < n_rows ? n_lo + j : N + n_lo + (j - n_rows);
            if (HAS_SCALE) row_params[j] = scale[n];
            if (HAS_BIAS) row_params[(HAS_SCALE ? params_stride : 0) + j] = bias[n];
        }
    }
    uint4 gw[CPL][EPC / 8];  // the norm weight over this lane's chunks
#if LN
    uint4 gb[CPL][EPC / 8];  // and the LayerNorm's bias
#endif
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        const int c = warp < WARPS ? lane_chunk(i, lane, warp, chunks) : -1;
#pragma unroll
        for (int h8 = 0; h8 < EPC / 8; ++h8) {
            gw[i][h8] = NORM && c >= 0 ? norm_w[c * (EPC / 8) + h8] : make_uint4(0, 0, 0, 0);
#if LN
            gb[i][h8] = c >= 0 ? norm_b[c * (EPC / 8) + h8] : make_uint4(0, 0, 0, 0);
#endif
        }
    }
#if USE_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    if (threadIdx.x == 0) stamp(2);

    // h = x (+ residual) over this lane's chunks, kept as x's dtype (h is rounded to it), and its
    // sum of squares over the chunks this lane owns: the owners' chunks cover K once (with MMA,
    // the lanes of one segment hold the same chunks, and the first SEGS groups own them). Block 0
    // writes h out.
    u32 hp[CPL][EPC / 2];
    float sum_sq = 0.f, sum = 0.f;  // (sum: LN's mean)
    const bool owner = !MMA || (lane >> 2) < SEGS;
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        const int c = warp < WARPS ? lane_chunk(i, lane, warp, chunks) : -1;
#pragma unroll
        for (int h8 = 0; h8 < EPC / 8; ++h8) {
            float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (c >= 0) {
                const int q = c * (EPC / 8) + h8;
                load_h(x, res, q, v);
                if (HAS_RES && blockIdx.x == 0 && owner) res_out[q] = pack8(v);
            }
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                if (owner) sum_sq = fmaf(v[e], v[e], fmaf(v[e + 1], v[e + 1], sum_sq));
                if (LN && owner) sum += v[e] + v[e + 1];
                hp[i][4 * h8 + e / 2] = (u32)f2x(v[e]) | ((u32)f2x(v[e + 1]) << 16);
            }
        }
    }
    float rstd = 1.f;
#if LN
    // LayerNorm: the mean, then the variance about it from h in registers (the producer adds 0).
    const float mean = block_sum(sum, partial_sq, WARPS + 1) / K;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        const int c = warp < WARPS ? lane_chunk(i, lane, warp, chunks) : -1;
#pragma unroll
        for (int e = 0; e < EPC / 2; ++e) {
            const float d0 = x2f((u16)(hp[i][e] & 0xffffu)) - mean, d1 = x2f((u16)(hp[i][e] >> 16)) - mean;
            if (owner && c >= 0) sq = fmaf(d0, d0, fmaf(d1, d1, sq));
        }
    }
    rstd = rsqrtf(block_sum(sq, partial_sq, WARPS + 1) / K + eps);
#else
    warp_sum_to(sum_sq, partial_sq);
    __syncthreads();
    if (NORM) rstd = rsqrtf(red_total(partial_sq, WARPS + 1) / K + eps);
#endif

    if (warp == WARPS) {
        // Producer: the rest of the ring, now that x is in; then refill each stage as soon as the
        // warps are done with it, and finish its rows.
        if (lane == 0)
            for (int i = PRE; i < min(STAGES, count); ++i) issue(i);
        const float post = MMA || LN ? 1.f : rstd;  // the MMA's x (and LN's) is normed already
        for (int i = 0; i < count; ++i) {
            const int s = i % STAGES;
            const u32 parity = (i / STAGES) & 1;
            mbar_wait(&empty[s], parity);
            if (lane == 0 && i + STAGES < count) issue(i + STAGES);
            const int n = (g_lo + i) * ROWS + lane;
            if (lane < ROWS && n < N) {
                float y = 0.f, up = 0.f;
#pragma unroll
                for (int v = 0; v < WARPS; ++v) {
                    y += partial[s][parity][v][lane];
                    if (GLU) up += partial[s][parity][v][ROWS + lane];
                }
                const int j = n - n_lo;
                out[n] = finish_output(y * post, up * post, row_params, row_params + (HAS_SCALE ? params_stride : 0),
                                       j, n_rows + j, ADD ? x2f(add[n]) : 0.f);
            }
        }
        if (lane == 0) stamp(7), stamp(8);
        return;
    }

    // Consumers: x as the product reads it.
#if MMA
    u32 (&xb)[CPL][EPC / 2] = hp;  // B pairs, in place of h: round(h * rstd) * norm weight, in the MMA's type
#elif XQ
    u32 xq[CPL][8];  // x's chunk in 16-bit fixed point: 4 words of high bytes (signed), 4 of low
    float xs[CPL];   // and the chunk's scale, a power of two
#else
    float xr[CPL][EPC];    // h * norm weight, fp32 (rstd goes on the sum)
#endif
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        const int c = lane_chunk(i, lane, warp, chunks);
#if XQ
        float xf[EPC];
#endif
#pragma unroll
        for (int h8 = 0; h8 < EPC / 8; ++h8) {
            float g[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f};
            if (NORM && c >= 0) unpack8(gw[i][h8], g);
#if LN
            float b[8];
            unpack8(gb[i][h8], b);
#endif
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const u32 pair = hp[i][4 * h8 + e / 2];
                float v0 = x2f((u16)(pair & 0xffffu)), v1 = x2f((u16)(pair >> 16));
#if LN
                // LayerNorm's output as the unfused norm rounds it (the MMA's type rounds it below), and
                // no rstd on the sums (post = 1)
                v0 = fmaf((v0 - mean) * rstd, g[e], b[e]);
                v1 = fmaf((v1 - mean) * rstd, g[e + 1], b[e + 1]);
                if (!MMA) { v0 = round_x(v0); v1 = round_x(v1); }
#endif
#if MMA
                if (NORM && !LN) { v0 = round_x(v0 * rstd) * g[e]; v1 = round_x(v1 * rstd) * g[e + 1]; }
                xb[i][4 * h8 + e / 2] = to_mma_pair(v0, v1);
#elif XQ
                xf[8 * h8 + e] = LN ? v0 : v0 * g[e];  // (LN's norm weight is applied above)
                xf[8 * h8 + e + 1] = LN ? v1 : v1 * g[e + 1];
#else
                xr[i][8 * h8 + e] = LN ? v0 : v0 * g[e];
                xr[i][8 * h8 + e + 1] = LN ? v1 : v1 * g[e + 1];
#endif
            }
        }
#if XQ
        xs[i] = to_fixed16(xf, xq[i]);
#endif
    }

    if (threadIdx.x == 0) stamp(3);
    for (int i = 0; i < count; ++i) {
        const int s = i % STAGES;
        const u32 parity = (i / STAGES) & 1;
        mbar_wait(&full[s], parity);
        if (threadIdx.x == 0 && (i == 0 || i == count - 1)) stamp(i == 0 ? 4 : 5);
        const u32 st = stage0 + s * stage_bytes;
#if DRY
        (void)st;
#elif MMA
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            if (warp + WARPS * j >= steps) break;  // the same for the whole warp: the MMA needs all lanes
            const int c = lane_chunk(j, lane, warp, chunks), r0 = (lane >> 2) / SEGS, r1 = ((lane >> 2) + 8) / SEGS;
            uint4 wa = make_uint4(0, 0, 0, 0), wb = make_uint4(0, 0, 0, 0);
            if (c >= 0) {  // A rows past the stage's NR stay zero
                if (r0 < NR) wa = lds128(st + r0 * row_bytes + 16 * c);
                if (r1 < NR) wb = lds128(st + r1 * row_bytes + 16 * c);
            }
#pragma unroll
            for (int p = 0; p < EPC / 4; ++p)
                mma_16816(d, weight_pair(wa, 2 * p), weight_pair(wb, 2 * p), weight_pair(wa, 2 * p + 1),
                          weight_pair(wb, 2 * p + 1), xb[j][2 * p], xb[j][2 * p + 1]);
        }
        // D[m][m % SEGS] for m = g and g + 8: lane (g, sg / 2) holds them in d[sg & 1] and
        // d[2 + (sg & 1)]; then the sum over the segments of each row (lanes g of one g / SEGS).
        const int g = lane >> 2, sg = g % SEGS, from = 4 * g + (sg >> 1);
        float acc[2] = {__shfl_sync(0xffffffffu, (sg & 1) ? d[1] : d[0], from),
                        __shfl_sync(0xffffffffu, (sg & 1) ? d[3] : d[2], from)};
#pragma unroll
        for (int off = 4; off < 4 * SEGS; off <<= 1)
#pragma unroll
            for (int r = 0; r < 2; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
        if ((lane & 3) == 0 && sg == 0) {  // lane (g, 0) holds rows g / SEGS and (g + 8) / SEGS
            if (g / SEGS < NR) partial[s][parity][warp][g / SEGS] = acc[0];
            if ((g + 8) / SEGS < NR) partial[s][parity][warp][(g + 8) / SEGS] = acc[1];
        }
        __syncwarp();
#else
        const u32 base = st + 16 * (lane + 32 * warp);
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.f;
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
            if (lane + 32 * (warp + WARPS * j) >= chunks) break;
            uint4 wv[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) wv[r] = lds128(base + r * row_bytes + 16 * 32 * WARPS * j);
#pragma unroll
            for (int r = 0; r < NR; ++r) {
#if XQ
                acc[r] = fmaf((float)dot16_fixed(wv[r], xq[j]), xs[j], acc[r]);
#else
#pragma unroll
                for (int e = 0; e < EPC; ++e) acc[r] = fmaf(widen(wv[r], e), xr[j][e], acc[r]);
#endif
            }
        }
        // Sum over the lanes, transposing: each step halves the rows a lane carries and doubles
        // the lanes a row's sum covers (NR_POW2 - 1 shuffles), then plain steps finish the rows.
        float v[NR_POW2];
#pragma unroll
        for (int r = 0; r < NR_POW2; ++r) v[r] = r < NR ? acc[r] : 0.f;
#pragma unroll
        for (int half = NR_POW2 / 2, off = 16; half >= 1; half >>= 1, off >>= 1) {
            const bool upper = lane & off;
#pragma unroll
            for (int r = 0; r < half; ++r) {
                const float send = upper ? v[r] : v[r + half], keep = upper ? v[r + half] : v[r];
                v[r] = keep + __shfl_xor_sync(0xffffffffu, send, off);
            }
        }
#pragma unroll
        for (int off = 16 / NR_POW2; off > 0; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
        // Lane l now holds the sum of row l / (32 / NR_POW2).
        const int row = lane / (32 / NR_POW2);
        if (lane % (32 / NR_POW2) == 0 && row < NR) partial[s][parity][warp][row] = v[0];
        __syncwarp();
#endif
        if (lane == 0) {
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(&empty[s])) : "memory");
        }
    }
    if (threadIdx.x == 0) stamp(6);
}
#endif  // BULK
#if MMA && !BULK
// Tensor-core form: a block owns 16 rows of the mma.m16n8k16 A operand (16 output rows, or 8
// gate and their 8 up rows with GLU) and its WARPS warps split K. x is B (every column the same,
// column 0 used), staged in shared memory as the MMA's half type after the residual add and
// the norm. Lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of rows g and g + 8 at k offset
// t * EPC of each step; those EPC values fill its A slots of EPC / 4 MMAs, and its B slots hold
// the same k's of x, so the contraction pairs the right values for any layout of k within a
// step.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemv(const uint4* __restrict__ w, const uint4* __restrict__ x, const uint4* __restrict__ res,
     const uint4* __restrict__ norm_w, uint4* __restrict__ res_out, const u16* __restrict__ scale,
     const u16* __restrict__ bias, u16* __restrict__ out, int N, int K, float eps,
     const uint4* __restrict__ norm_b, const u16* __restrict__ add)
{
    extern __shared__ uint4 xs[];  // x as half2 pairs, zero-padded to whole steps
    __shared__ float partial_sq[WARPS];
    __shared__ float partial_y[WARPS][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int chunks = K / EPC, steps = (K + KSTEP - 1) / KSTEP;
    const int per_warp = (steps + WARPS - 1) / WARPS;
    const int s_lo = warp * per_warp, s_hi = min(s_lo + per_warp, steps);
    const int n0 = blockIdx.x * (GLU ? 8 : 16);
    const uint4* row_a = w + (size_t)min(n0 + g, N - 1) * chunks;  // A rows g ...
    const uint4* row_b = GLU ? w + (size_t)(N + min(n0 + g, N - 1)) * chunks  // ... and g + 8
                             : w + (size_t)min(n0 + g + 8, N - 1) * chunks;

    uint4 wa[UNROLL], wb[UNROLL];
#define LOAD_STEPS(s0)                                                            \
    _Pragma("unroll") for (int u = 0; u < UNROLL; ++u) {                          \
        const int c = ((s0) + u) * 4 + t;                                         \
        const bool ok = (s0) + u < s_hi && c < chunks;                            \
        wa[u] = ok ? load_stream(row_a + c) : make_uint4(0, 0, 0, 0);             \
        wb[u] = ok ? load_stream(row_b + c) : make_uint4(0, 0, 0, 0);             \
    }

    LOAD_STEPS(s_lo)  // independent of the kernel before: streams before the wait
#if USE_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // x -> shared memory: h = x (+ residual), then h * rstd * norm_w (LN: (h - mean) * rstd * norm_w
    // + norm_b), rounded to the MMA's type.
    float rstd = 1.f;
#if LN
    float mean;
    ln_stats(x, res, K, eps, partial_sq, mean, rstd);
#endif
    if (NORM && !LN) {
        float sum_sq = 0.f;
        for (int q = threadIdx.x; q < K / 8; q += WARPS * 32) {
            float v[8];
            load_h(x, res, q, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) sum_sq = fmaf(v[i], v[i], sum_sq);
        }
        warp_sum_to(sum_sq, partial_sq);
        __syncthreads();
        rstd = rsqrtf(red_total(partial_sq, WARPS) / K + eps);
    }
    for (int q = threadIdx.x; q < steps * KSTEP / 8; q += WARPS * 32) {
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (q < K / 8) {
            load_h(x, res, q, v);
            if (HAS_RES && blockIdx.x == 0) res_out[q] = pack8(v);
            if (NORM) {
                float nw[8];
                unpack8(norm_w[q], nw);
#if LN
                float nb[8];
                unpack8(norm_b[q], nb);
#pragma unroll
                for (int i = 0; i < 8; ++i) v[i] = fmaf((v[i] - mean) * rstd, nw[i], nb[i]);
#else
#pragma unroll
                for (int i = 0; i < 8; ++i) v[i] = round_x(v[i] * rstd) * nw[i];
#endif
            }
        }
        xs[q] = make_uint4(to_mma_pair(v[0], v[1]), to_mma_pair(v[2], v[3]), to_mma_pair(v[4], v[5]),
                           to_mma_pair(v[6], v[7]));
    }
    __syncthreads();

    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const u32* xs_pairs = reinterpret_cast<const u32*>(xs);
    for (int s0 = s_lo; s0 < s_hi;) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (s0 + u >= s_hi) break;
            const u32* xp = xs_pairs + ((s0 + u) * KSTEP + t * EPC) / 2;  // this lane's EPC values of x
            u32 xv[EPC / 2];
#pragma unroll
            for (int i = 0; i < EPC / 8; ++i) {
                const uint4 q = reinterpret_cast<const uint4*>(xp)[i];
                xv[4 * i] = q.x; xv[4 * i + 1] = q.y; xv[4 * i + 2] = q.z; xv[4 * i + 3] = q.w;
            }
#pragma unroll
            for (int j = 0; j < EPC / 4; ++j)
                mma_16816(d, weight_pair(wa[u], 2 * j), weight_pair(wb[u], 2 * j), weight_pair(wa[u], 2 * j + 1),
                          weight_pair(wb[u], 2 * j + 1), xv[2 * j], xv[2 * j + 1]);
#if PIPE
            // Rolling: refill this step's registers with the step UNROLL ahead.
            const int ahead = s0 + u + UNROLL, c = ahead * 4 + t;
            const bool ok = ahead < s_hi && c < chunks;
            wa[u] = ok ? load_stream(row_a + c) : make_uint4(0, 0, 0, 0);
            wb[u] = ok ? load_stream(row_b + c) : make_uint4(0, 0, 0, 0);
#endif
        }
        s0 += UNROLL;
        if (s0 >= s_hi) break;
#if !PIPE
        LOAD_STEPS(s0)
#endif
    }

    // Column 0 of D: lanes with t == 0 hold rows g (d[0]) and g + 8 (d[2]). Sum the warps' K slices.
    if (t == 0) {
        partial_y[warp][g] = d[0];
        partial_y[warp][g + 8] = d[2];
    }
    __syncthreads();
    if (threadIdx.x < (GLU ? 8 : 16)) {
        const int r = threadIdx.x, n = n0 + r;
        float y = 0.f, up = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) {
            y += partial_y[i][r];
            if (GLU) up += partial_y[i][r + 8];
        }
        if (n < N) out[n] = finish_output(y, up, scale, bias, n, N + n, ADD ? x2f(add[n]) : 0.f);
    }
}
#endif  // MMA && !BULK
"""

# The FFMA form's tiles: warps per block, output rows per warp, 16-byte chunks in flight per row
# and lane, blocks per multiprocessor (0: one block per WARPS * ROWS rows; else a persistent grid
# of that many blocks per multiprocessor), and PIPE: 0 loads a step's UNROLL chunks together
# after using the last step's, 1 refills each chunk's registers as soon as it is used. These won
# the FFMA form's batch-1 stack sweep on the H200 (docs/benchmarks-history.md). A config without BULK or
# MMA is the FFMA form, on top of these.
FFMA_CONFIG = dict(WARPS=8, ROWS=2, UNROLL=4, BLOCKS=0)
FFMA_GLU_CONFIG = dict(WARPS=8, ROWS=2, UNROLL=2, BLOCKS=0)
# The bulk-copy form (BULK=1): consumer warps, ROWS and STAGES (0: worked out per K, bulk_tiles),
# blocks per multiprocessor, PRE (stages streamed before the wait for the kernel before, the rest
# once x is in; 0: the whole ring) and DP4A (int8 weights multiplied by dp4a). The default, with PDL: fastest in the
# batch-1 stack sweeps, bf16 and int8 (`python benchmarks/gemv_bench.py --sweep`, docs/benchmarks-history.md).
BULK_CONFIG = dict(BULK=1, WARPS=8, ROWS=0, STAGES=0, BLOCKS=2, PRE=2, DP4A=1)
DEFAULT_CONFIG = BULK_CONFIG


MAX_K = 50 << 10  # x is staged as fp32 in shared memory: 200 KB at most (Hopper allows 227 KB)
MAX_DYNAMIC_SHARED = 4 * MAX_K  # what a variant is allowed (leaves room for its static shared memory)


@functools.cache
def available() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def operands_fit(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """The kernel's operand rules, on any device: one fp16/bf16 row, a contiguous 16-bit weight
    (or a 1-byte one with a scale) made of whole 16-byte chunks per row and at most MAX_K
    columns, scale and bias in x's dtype."""
    w_bytes = weight.element_size()
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and w_bytes in (1, 2) and (w_bytes == 1) == (scale is not None)
            and (w_bytes == 1 or weight.dtype == x.dtype) and weight.is_contiguous()
            and weight.shape[1] % (16 // w_bytes) == 0 and weight.shape[1] <= MAX_K and weight.data_ptr() % 16 == 0
            and all(t is None or t.dtype == x.dtype for t in (scale, bias)))


def fits(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether the kernel runs for these operands here: a CUDA device, CuPy, and `operands_fit`."""
    return x.is_cuda and operands_fit(x, weight, scale, bias) and available()


def defines(*, x_fp16: bool, w_bytes: int, fp8: bool, norm: bool, res: bool, glu: bool,
            scale: bool, bias: bool, pdl: bool, WARPS: int, ln: bool = False, gelu: bool = False, add: bool = False,
            UNROLL: int = 1, ROWS: int = 1, PIPE: int = 0, MMA: int = 0, BULK: int = 0, STAGES: int = 0, PRE: int = 0,
            CPL: int = 0, DP4A: int = 0, DRY: int = 0, TRACE: int = 0, **launch) -> str:
    """The variant's #defines. `ln` (with `norm`): LayerNorm with a bias; `gelu`: GELU after the
    product; `add`: an addend before the bias. DP4A=1 has the bulk FFMA form multiply int8 weights by dp4a (its
    default; no effect on other weights or forms). Two measuring knobs of the bulk form: DRY=1 has
    the consumers release each stage unread, so a launch times the weight stream alone (its output
    is wrong); TRACE=1 has each block stamp its timeline (`trace_of`)."""
    assert not ln or norm, "LayerNorm is a norm: pass norm=True with ln=True"
    assert not add or not (glu or gelu), "the addend goes on a plain product (a parallel residual's partial)"
    flags = dict(X_FP16=x_fp16, W_BYTES=w_bytes, W_FP8=fp8, NORM=norm, LN=ln, HAS_RES=res, GLU=glu, GELU=gelu,
                 ADD=add, HAS_SCALE=scale, HAS_BIAS=bias, USE_PDL=pdl, WARPS=WARPS, ROWS=ROWS, UNROLL=UNROLL, PIPE=PIPE,
                 MMA=MMA, BULK=BULK, STAGES=STAGES, PRE=PRE, CPL=CPL, DP4A=DP4A,
                 DRY=DRY, TRACE=TRACE)
    return "".join(f"#define {k} {int(v)}\n" for k, v in flags.items())


# The bulk-copy form's ring: stages of about STAGE_BYTES, about RING_BYTES in all (tiles STAGE_KB
# and RING_KB change them), so that two blocks fit in a multiprocessor's 228 KB. At most 8 rows a
# stage (16 with GLU): FFMA keeps each row's sum in a register a lane, and MMA's A operand has 16.
BULK_STAGE_BYTES = 32 << 10
BULK_RING_BYTES = 96 << 10
BULK_MAX_ROWS = 8


def bulk_tiles(K: int, w_bytes: int, glu: bool, tiles: dict) -> dict:
    """The bulk-copy form's tiles with the ones left at 0 worked out for this K: ROWS rows a stage
    (of gate and of up with GLU: at most BULK_MAX_ROWS, so at most 16 rows for MMA's A operand),
    STAGES stages, one block a multiprocessor, PRE (0: all STAGES), and CPL, the rounds of K each
    consumer lane takes (32 chunks a warp round with FFMA; with MMA, 4 chunks of each of
    16 / (rows a stage, rounded up to a power of two, at least 2) segments)."""
    t = dict(tiles)
    row_bytes = K * w_bytes * (2 if glu else 1)
    stage_target = (t.pop("STAGE_KB", 0) << 10) or BULK_STAGE_BYTES
    ring_target = (t.pop("RING_KB", 0) << 10) or BULK_RING_BYTES
    max_rows = BULK_MAX_ROWS
    t["ROWS"] = t.get("ROWS") or max(1, min(max_rows, stage_target // row_bytes))
    stage = t["ROWS"] * row_bytes
    t["STAGES"] = t.get("STAGES") or max(2, min(12, ring_target // stage))
    t["BLOCKS"] = t.get("BLOCKS") or 1
    if t.get("PRE", 0) < 0:
        raise ValueError(f"bulk GEMV tiles {tiles}: PRE={t['PRE']} stages before the wait; use 0 (the whole ring) "
                         f"to {t['STAGES']}")
    t["PRE"] = min(t.get("PRE") or t["STAGES"], t["STAGES"])
    chunks = K * w_bytes // 16
    if t.get("MMA"):  # 4 chunks of each of the 16 / (stage rows) segments a warp step
        rows = t["ROWS"] * (2 if glu else 1)
        segs = 16 // max(2, 1 << (rows - 1).bit_length())
        steps = -(-(-(-chunks // segs)) // 4)
    else:  # 32 chunks a warp step
        steps = -(-chunks // 32)
    t["CPL"] = -(-steps // t["WARPS"])
    if t["ROWS"] > max_rows or t["STAGES"] * stage > MAX_DYNAMIC_SHARED:
        raise ValueError(f"bulk GEMV tiles {tiles} need {t['ROWS']} rows a stage and a {t['STAGES'] * stage} B ring "
                         f"for K={K}; at most {max_rows} and {MAX_DYNAMIC_SHARED} B: use fewer ROWS or STAGES")
    return t


def compile_ptx(source_defines: str, arch: str = "compute_90") -> str:
    """The kernel's PTX for these `defines`, with no GPU needed (cuda_runtime.compile_ptx)."""
    return cuda_runtime.compile_ptx(source_defines + SOURCE, arch)


@functools.cache
def _function(source_defines: str, device_index: int) -> int:
    """The compiled variant, allowed MAX_DYNAMIC_SHARED bytes: staging x of MAX_K columns, or the
    bulk form's ring and row parameters."""
    return cuda_runtime.load_function(source_defines + SOURCE, "gemv", device_index, MAX_DYNAMIC_SHARED)


def trace_of(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
             norm_weight: torch.Tensor | None, residual: torch.Tensor | None, glu: bool, config: dict) -> torch.Tensor:
    """The block timelines (int64 [blocks, 9], see the kernel's TRACE) that the last launch of these
    operands with `config` (BULK=1, TRACE=1) left."""
    if not config.get("TRACE"):
        raise ValueError(f"trace_of reads the stamps of a TRACE=1 variant; {config} has none: add TRACE=1 "
                         f"(and BULK=1) to the config the launches ran with")
    src, _, (grid, _, _), _ = _variant(x, weight, scale, bias, norm_weight, residual, glu, config)
    import cupy
    pointer = cuda_runtime.load_module(src + SOURCE, _device_index(x)).get_global("gemv_trace")
    return torch.as_tensor(cupy.ndarray((grid, 9), dtype=cupy.int64, memptr=pointer), device=x.device).clone()


def _device_index(x: torch.Tensor) -> int:
    return x.device.index if x.device.index is not None else torch.cuda.current_device()


def _variant(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
             norm_weight: torch.Tensor | None, residual: torch.Tensor | None, glu: bool,
             config: dict | None, ln: bool = False, gelu: bool = False,
             add: bool = False) -> tuple[str, dict, tuple[int, int, int], bool]:
    """(defines, tiles, (blocks, threads, shared bytes), PDL) of the launch for these operands."""
    K, N = x.shape[1], weight.shape[0] // (2 if glu else 1)
    tiles, shape = launch_plan(config, N, K, weight.element_size(), glu, hopper_or_later(x), sm_count(x),
                               scale is not None, bias is not None)
    pdl = use_gemv_pdl(x, bool(tiles.get("BULK")))
    src = defines(x_fp16=x.dtype == torch.float16, w_bytes=weight.element_size(),
                  fp8=weight.dtype == torch.float8_e4m3fn, norm=norm_weight is not None, res=residual is not None,
                  glu=glu, scale=scale is not None, bias=bias is not None, pdl=pdl, ln=ln, gelu=gelu, add=add,
                  **tiles)
    return src, tiles, shape, pdl


def _aligned(t: torch.Tensor | None) -> torch.Tensor | None:
    """t, or a contiguous copy where the kernel's 16-byte loads need one."""
    if t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def fused_linear_cuda(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                      bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                      residual: torch.Tensor | None, eps: float, glu: bool,
                      config: dict | None = None, norm_bias: torch.Tensor | None = None, gelu: bool = False,
                      add: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y [1, N], new residual or None); the operands satisfy `fits`. `norm_bias` (with
    `norm_weight`): the norm is LayerNorm; `gelu`: GELU after the product; `add` [1, N]: added
    to the product before the bias (gemv.fused_linear says how each rounds)."""
    K = x.shape[1]
    N = weight.shape[0] // 2 if glu else weight.shape[0]
    assert weight.shape[1] == K, f"weight is {tuple(weight.shape)}, x has {K} columns"
    assert add is None or add.shape[-1] == N, f"the addend has {add.shape[-1]} columns, the product {N}"
    src, _, (grid, block, shared), pdl = _variant(x, weight, scale, bias, norm_weight, residual, glu, config,
                                                  ln=norm_bias is not None, gelu=gelu, add=add is not None)
    function = _function(src, _device_index(x))
    x, residual, norm_weight, norm_bias = (_aligned(t) for t in (x, residual, norm_weight, norm_bias))
    add = add if add is None or add.is_contiguous() else add.contiguous()
    out = torch.empty((1, N), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)  # noqa: E731
    args = [ptr(weight), ptr(x), ptr(residual), ptr(norm_weight), ptr(res_out), ptr(scale), ptr(bias), ptr(out),
            ctypes.c_int(N), ctypes.c_int(K), ctypes.c_float(eps), ptr(norm_bias), ptr(add)]
    cuda_runtime.launch(function, grid, block, shared, torch.cuda.current_stream(x.device).cuda_stream, args, pdl)
    return out, res_out


def launch_plan(config: dict | None, N: int, K: int, w_bytes: int, glu: bool, hopper: bool, sms: int,
                scale: bool, bias: bool) -> tuple[dict, tuple[int, int, int]]:
    """(tiles, (blocks, threads a block, dynamic shared bytes)) of one launch. With no tiles asked,
    a shape whose bulk ring (and row parameters) would not fit in shared memory takes the FFMA
    form; asked-for bulk tiles that do not fit are a ValueError naming the knobs."""
    asked = {k: v for k, v in (config or {}).items() if k != "backend"}
    try:
        tiles = resolve_tiles(config, K, w_bytes, glu, hopper)
        shape = geometry(N, K, glu, w_bytes, tiles, sms, scale, bias)
        if tiles.get("BULK") and shape[2] > MAX_DYNAMIC_SHARED:
            raise ValueError(f"bulk GEMV tiles {tiles} need {shape[2]} B of dynamic shared memory for N={N}, "
                             f"K={K}; at most {MAX_DYNAMIC_SHARED}: use fewer ROWS or STAGES, or more BLOCKS")
    except ValueError:
        if asked:
            raise
        tiles = dict(FFMA_GLU_CONFIG if glu else FFMA_CONFIG)
        shape = geometry(N, K, glu, w_bytes, tiles, sms, scale, bias)
    return tiles, shape


def resolve_tiles(config: dict | None, K: int, w_bytes: int, glu: bool, hopper: bool = True) -> dict:
    """A config's tiles in full: none asked (or BULK) is the bulk form on top of BULK_CONFIG; MMA
    or FFMA tiles go on top of the FFMA defaults. The bulk form's copies and barriers need Hopper
    (sm_90): before it, none asked is the FFMA form, and asking for BULK is an error."""
    asked = {k: v for k, v in (config or {}).items() if k != "backend"}
    if asked.get("BULK") and not hopper:
        raise ValueError(f"GEMV tiles {asked} ask for the bulk-copy form, which needs a Hopper GPU (sm_90) or "
                         f"later: drop BULK from the config (tune-gemm on this GPU does not offer it)")
    if hopper and (not asked or asked.get("BULK")):
        return bulk_tiles(K, w_bytes, glu, dict(BULK_CONFIG, **asked))
    return dict(FFMA_GLU_CONFIG if glu else FFMA_CONFIG, **asked)


def geometry(N: int, K: int, glu: bool, w_bytes: int, tiles: dict, sms: int, scale: bool = False,
             bias: bool = False) -> tuple[int, int, int]:
    """(blocks, threads a block, dynamic shared bytes) of a launch with `tiles`, for N outputs (the
    bulk form also stages the rows' scales and biases)."""
    if tiles.get("BULK"):  # persistent: BLOCKS a multiprocessor, a producer warp beside WARPS consumers
        rows, groups = tiles["ROWS"] * (2 if glu else 1), -(-N // tiles["ROWS"])
        grid = min(tiles["BLOCKS"] * sms, groups)
        # the ring, then the most rows a block owns (gate and up): their scales and biases
        params = 2 * (2 if glu else 1) * -(-groups // grid) * tiles["ROWS"] * (scale + bias)
        return grid, 32 * (tiles["WARPS"] + 1), tiles["STAGES"] * rows * K * w_bytes + params
    if tiles.get("MMA"):  # 16 A rows a block (8 outputs with GLU); x as half pairs, whole steps
        rows_per_block, kstep = (8 if glu else 16), 64 // w_bytes
        grid, shared = -(-N // rows_per_block), 2 * kstep * -(-K // kstep)
    else:  # WARPS * ROWS outputs a block; x as fp32
        grid, shared = -(-N // (tiles["WARPS"] * tiles["ROWS"])), 4 * K
        if tiles.get("BLOCKS"):
            grid = min(grid, tiles["BLOCKS"] * sms)
    return grid, 32 * tiles["WARPS"], shared
