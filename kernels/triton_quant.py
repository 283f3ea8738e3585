"""Triton int8 weight-only GEMM for small M (decode): y = (x @ w_int8.T) * scale + bias.

Decode is bound by the bytes of the weights, so the kernel streams int8 [N, K] tiles, dequantises
them in registers and applies the per-output-channel scale once, in the epilogue (scale is constant
along K). Imported only when a CUDA tensor arrives. How the int8 values become matrix-unit operands
is a compile-time choice (W_MODE), timed in benchmarks/kernels_bench.py:

    0  w.to(x.dtype), dot in x's dtype (bf16/fp16)
    1  exact int8 -> fp32 by the 1.5 * 2^23 magic-number trick (integer add + float subtract, no
       conversion instructions), x upcast to fp32, tf32 dot (exact: int8 and bf16 fit tf32)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _int8_linear_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K,
                        stride_xm, stride_wn, stride_om,
                        HAS_BIAS: tl.constexpr, W_MODE: tl.constexpr, EVEN_K: tl.constexpr,
                        DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    m_mask = offs_m[:, None] < M
    n_mask = offs_n[:, None] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask, other=0.0)
            w = tl.load(w_ptrs, mask=n_mask, other=0)
        else:
            k_mask = (k0 + offs_k[None, :]) < K
            x = tl.load(x_ptrs, mask=m_mask & k_mask, other=0.0)
            w = tl.load(w_ptrs, mask=n_mask & k_mask, other=0)
        if W_MODE == 0:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
        else:
            wf = (w.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
            acc = tl.dot(x.to(tl.float32), tl.trans(wf), acc, input_precision="tf32")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    scale = tl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    y = acc * scale[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
             y.to(out_ptr.dtype.element_ty), mask=m_mask & (offs_n[None, :] < N))


# Default launch configuration by M bucket; benchmarks/kernels_bench.py sweeps alternatives.
SMALL_M_MAX = 64
_CONFIGS = {
    16: dict(BLOCK_N=16, BLOCK_K=256, W_MODE=0, num_warps=4, num_stages=4),
    32: dict(BLOCK_N=32, BLOCK_K=128, W_MODE=0, num_warps=4, num_stages=4),
    64: dict(BLOCK_N=64, BLOCK_K=128, W_MODE=0, num_warps=4, num_stages=3),
}


def int8_linear_triton(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    N, K = w_int8.shape
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if (M > SMALL_M_MAX or x.dtype == torch.float32) and config is None:
        # Compute-bound (or fp32, whose exact dot spills): dequantise and let cuBLAS multiply.
        w = w_int8.to(x.dtype) * scale.to(x.dtype)[:, None]
        return torch.nn.functional.linear(x, w, bias)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    assert w_int8.stride(-1) == 1, "int8 weight rows must be contiguous"
    block_m = 16 if M <= 16 else (32 if M <= 32 else 64)
    cfg = dict(config or _CONFIGS[block_m])
    block_m = cfg.pop("BLOCK_M", block_m)
    if x.dtype == torch.float32:
        cfg["W_MODE"] = 0  # tf32 would round fp32 activations: keep the exact (slow) ieee dot
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M:
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, block_m))
        _int8_linear_kernel[grid](x2, w_int8, scale, bias if bias is not None else scale, out,
                                  M, N, K, x2.stride(0), w_int8.stride(0), out.stride(0),
                                  HAS_BIAS=bias is not None, EVEN_K=K % cfg["BLOCK_K"] == 0,
                                  DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                  BLOCK_M=block_m, **cfg)
    return out.view(*x.shape[:-1], N)
