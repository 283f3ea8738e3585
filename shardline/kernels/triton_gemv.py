"""Triton GEMV for decode at batch 1, with RMSNorm before and SwiGLU after fused in (gemv.py).

Decode reads every weight once per step, so this kernel is a weight stream: each program owns
BLOCK_N output columns and walks K in BLOCK_K tiles, keeping an fp32 [BLOCK_N, BLOCK_K]
accumulator of elementwise products that it reduces once at the end (no per-tile shuffles, no
split-K partials, one launch). x is one row: a [BLOCK_K] slice broadcast over the tile's rows
costs no data movement. Each program issues tile i + 1's loads before it computes on tile i, and
many programs share a multiprocessor, so loads are always in flight.

Programmatic dependent launch (Hopper; `_dispatch.use_pdl`): the weights depend on no earlier
kernel, so each program loads its first tile, then waits for the previous kernel (`pdl_wait`)
before it reads x.

RMSNorm is folded in with one pass over x: the products use norm_weight * (x + residual), the sum
of squares runs beside them, and 1/rms multiplies the finished sums (the unfused norm rounds the
normed input to x's dtype first; here it stays fp32, within the same tolerance).

int8 weights are widened with the float trick: 0x4B000000 | (q + 128), read as fp32, is
2^23 + 128 + q exactly; subtracting 2^23 + 128 leaves q. That is integer and fp32 arithmetic only,
which runs at several times the rate of the int -> float conversion instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_args
from .triton_pdl import pdl_wait


@triton.jit
def _widen(w, INT8: tl.constexpr, FP8: tl.constexpr):
    if INT8:  # 0x4B000080 is the bit pattern of 2^23 + 128 = 8388736.0
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    if FP8:  # loaded as bytes: a masked load cannot fill fp8 with a zero
        return w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return w.to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, res_ptr, norm_ptr, res_out_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
                 N, K, eps, stride_w,
                 NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                 HAS_BIAS: tl.constexpr, GLU: tl.constexpr, INT8: tl.constexpr, FP8: tl.constexpr, USE_PDL: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_w
    up_rows = w_rows + N * stride_w  # GLU: the up rows sit N rows below the gate rows
    # The first tiles depend on no earlier kernel: they stream before the wait.
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0)
    u = w
    if GLU:
        u = tl.load(up_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0)
    pdl_wait(USE_PDL)

    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    sum_sq = tl.zeros([BLOCK_K], tl.float32)
    for i in range(0, tl.cdiv(K, BLOCK_K)):
        # Issue tile i + 1's loads (masked off past K), then compute on tile i.
        kn = (i + 1) * BLOCK_K + offs_k
        next_mask = n_mask[:, None] & (kn[None, :] < K)
        w_next = tl.load(w_rows + kn[None, :], mask=next_mask, other=0)
        u_next = w_next
        if GLU:
            u_next = tl.load(up_rows + kn[None, :], mask=next_mask, other=0)
        kk = i * BLOCK_K + offs_k
        k_mask = kk < K
        x = tl.load(x_ptr + kk, mask=k_mask, other=0.0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(res_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)).to(x.dtype)
            if pid == 0:  # the new residual stream, written once
                tl.store(res_out_ptr + kk, x, mask=k_mask)
        xf = x.to(tl.float32)
        if NORM:
            sum_sq += xf * xf
            xf = xf * tl.load(norm_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
        acc += _widen(w, INT8, FP8) * xf[None, :]
        if GLU:
            acc_up += _widen(u, INT8, FP8) * xf[None, :]
        w, u = w_next, u_next

    rstd = 1.0
    if NORM:  # RMSNorm's 1/rms is one factor for the row: applied to the sums
        rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / K + eps)
    y = tl.sum(acc, axis=1) * rstd  # [BLOCK_N]
    if HAS_SCALE:
        y *= tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    out_ty = out_ptr.dtype.element_ty
    if GLU:  # silu(gate) * up, each rounded where the unfused kernels round
        up = tl.sum(acc_up, axis=1) * rstd
        if HAS_SCALE:
            up *= tl.load(scale_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            up += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        g = y.to(out_ty).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)
        y = silu * up.to(out_ty).to(tl.float32)
    tl.store(out_ptr + offs_n, y.to(out_ty), mask=n_mask)


def default_config(glu: bool) -> dict:
    """32 weight elements per thread per tile (16 with gate/up, which streams two tiles), the
    largest tiles that compile to <= 128 registers a thread without spills for every variant
    (`python benchmarks/gemv_registers.py`: 115-118 bf16, 89 int8). Chosen by register count, not
    yet by time; `shardline tune-gemm` times the alternatives."""
    if glu:
        return dict(BLOCK_N=8, BLOCK_K=512, num_warps=8, num_stages=1)
    return dict(BLOCK_N=8, BLOCK_K=1024, num_warps=8, num_stages=1)


def fused_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                        bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                        residual: torch.Tensor | None, eps: float, glu: bool,
                        config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    M, K = x.shape
    assert M == 1, "the GEMV kernel takes one row (gemv.fits)"
    N = weight.shape[0] // 2 if glu else weight.shape[0]
    assert weight.shape[1] == K, f"weight is {tuple(weight.shape)}, x has {K} columns"
    x = x.contiguous()
    residual = residual.contiguous() if residual is not None else None
    cfg = dict(config or default_config(glu))
    out = torch.empty((1, N), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    dummy = x
    fp8 = weight.dtype == torch.float8_e4m3fn
    _gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x, residual if residual is not None else dummy, norm_weight if norm_weight is not None else dummy,
        res_out if res_out is not None else dummy, weight.view(torch.uint8) if fp8 else weight,
        scale if scale is not None else dummy,
        bias if bias is not None else dummy, out, N, K, eps, weight.stride(0),
        NORM=norm_weight is not None, HAS_RES=residual is not None, HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None, GLU=glu, INT8=weight.dtype == torch.int8, FP8=fp8, **cfg, **pdl_args(x))
    return out, res_out
