"""Triton GEMV for decode (M <= 4 rows), with RMSNorm before and SwiGLU after fused in (gemv.py).

Decode reads every weight once per step, so this kernel is a weight stream: each program owns
BLOCK_N output columns and walks K in BLOCK_K tiles, keeping an fp32 [M, BLOCK_N, BLOCK_K]
accumulator of elementwise products and reducing it once at the end (no per-tile shuffles, no
split-K partials, one launch). The next tile's weights are loaded before the current tile is
used, so one tile per program is always in flight.

Programmatic dependent launch (Hopper; `_dispatch.use_pdl`): the weights depend on no earlier
kernel, so each program starts loading its first tile, then waits for the previous kernel
(`gdc_wait`) before reading x. Launched with PDL, the kernel's programs are already resident and
streaming while the previous kernel drains, which hides most of the gap at each boundary.

RMSNorm is folded in with one pass over x: the products use norm_weight * (x + residual), the sum
of squares runs beside them, and the row's 1/rms multiplies the finished sums (the unfused norm
rounds the normed input to bf16 first; here it stays fp32, within the same tolerance).

int8 weights are widened with the float trick: 0x4B000000 | (q + 128), read as fp32, is
2^23 + 128 + q exactly; subtracting 2^23 + 128 leaves q. That is integer and fp32 arithmetic only,
which runs at several times the rate of the int -> float conversion instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2, pdl_args
from .triton_pdl import pdl_wait

@triton.jit
def _widen(w, INT8: tl.constexpr):
    if INT8:  # 0x4B000080 is the bit pattern of 2^23 + 128 = 8388736.0
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    return w.to(tl.float32)


@triton.jit
def _x_tile(x_ptr, res_ptr, norm_ptr, res_out_ptr, offs_m, kk, M, K, stride_x, stride_res, write_res,
            NORM: tl.constexpr, HAS_RES: tl.constexpr):
    """(fp32 [BLOCK_M, BLOCK_K] tile of the product's input, its raw rows for the norm's sum of
    squares): x, or norm_weight * (x + residual) with the 1/rms factor left for the epilogue."""
    mask = (offs_m[:, None] < M) & (kk[None, :] < K)
    x = tl.load(x_ptr + offs_m[:, None] * stride_x + kk[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + offs_m[:, None] * stride_res + kk[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like the unfused add
        if write_res:  # the new residual stream, written by one program
            tl.store(res_out_ptr + offs_m[:, None] * K + kk[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    if NORM:
        nw = tl.load(norm_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        return nw[None, :] * xf, xf
    return xf, xf


@triton.jit
def _gemv_kernel(x_ptr, res_ptr, norm_ptr, res_out_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
                 M, N, K, eps, stride_x, stride_res, stride_w, stride_out,
                 NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                 HAS_BIAS: tl.constexpr, GLU: tl.constexpr, INT8: tl.constexpr, USE_PDL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
    # First weight tiles: no earlier kernel writes them, so they stream before the wait below.
    w_mask = n_mask[:, None] & (offs_k[None, :] < K)
    w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0)
    if GLU:  # the up rows sit N rows below the gate rows
        w2 = tl.load(w_rows + N * stride_w + offs_k[None, :], mask=w_mask, other=0)
    pdl_wait(USE_PDL)

    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    sum_sq = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for i in range(0, tl.cdiv(K, BLOCK_K)):
        # Issue the next tile's loads, then compute on this one.
        k0 = i * BLOCK_K
        kn = k0 + BLOCK_K + offs_k
        next_mask = n_mask[:, None] & (kn[None, :] < K)
        w_next = tl.load(w_rows + kn[None, :], mask=next_mask, other=0)
        if GLU:
            w2_next = tl.load(w_rows + N * stride_w + kn[None, :], mask=next_mask, other=0)
        x, raw = _x_tile(x_ptr, res_ptr, norm_ptr, res_out_ptr, offs_m, k0 + offs_k, M, K, stride_x,
                         stride_res, pid == 0, NORM, HAS_RES)
        if NORM:
            sum_sq += raw * raw
        acc += x[:, None, :] * _widen(w, INT8)[None, :, :]
        w = w_next
        if GLU:
            acc2 += x[:, None, :] * _widen(w2, INT8)[None, :, :]
            w2 = w2_next

    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    rstd = tl.full([BLOCK_M], 1.0, tl.float32)
    if NORM:  # RMSNorm's 1/rms is one factor per row: applied to the sums, not to every input
        rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=1) / K + eps)
        y *= rstd[:, None]
    if HAS_SCALE:
        y *= tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_ty = out_ptr.dtype.element_ty
    if GLU:  # silu(gate) * up, each rounded where the unfused kernels round
        up = tl.sum(acc2, axis=2) * rstd[:, None]
        if HAS_SCALE:
            up *= tl.load(scale_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            up += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        g = y.to(out_ty).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)
        y = silu * up.to(out_ty).to(tl.float32)
    out_mask = (offs_m[:, None] < M) & n_mask[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :], y.to(out_ty), mask=out_mask)


def default_config(M: int, N: int, K: int, int8: bool) -> dict:
    """Tiles of 16 KB or so per program (int8: twice the columns of K), at least ~2 programs per
    multiprocessor. Placeholder choices until `shardline tune-gemm` times them on the GPU."""
    block_k = 512 if int8 else 256
    block_n = 16 if N >= 4096 else 8
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)


def fused_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                        bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                        residual: torch.Tensor | None, eps: float, glu: bool,
                        config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    M, K = x.shape
    N = weight.shape[0] // 2 if glu else weight.shape[0]
    assert weight.shape[1] == K, f"weight is {tuple(weight.shape)}, x has {K} columns"
    if x.stride(-1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    cfg = dict(config or default_config(M, N, K, weight.dtype == torch.int8))
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if (norm_weight is not None and residual is not None) else None
    dummy = x
    grid = (triton.cdiv(N, cfg["BLOCK_N"]),)
    _gemv_kernel[grid](
        x, residual if residual is not None else dummy, norm_weight if norm_weight is not None else dummy,
        res_out if res_out is not None else dummy, weight, scale if scale is not None else dummy,
        bias if bias is not None else dummy, out, M, N, K, eps, x.stride(0),
        residual.stride(0) if residual is not None else 0, weight.stride(0), out.stride(0),
        NORM=norm_weight is not None, HAS_RES=residual is not None, HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None, GLU=glu, INT8=weight.dtype == torch.int8,
        BLOCK_M=next_pow2(M), **cfg, **pdl_args(x))
    return out, res_out
