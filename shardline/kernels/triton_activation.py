"""Triton MLP activations. Imported only when a CUDA tensor arrives.

silu_and_mul reads the fused gate/up row once and writes half of it; silu(gate) is rounded to the
input dtype before the multiply, as the reference's two torch ops round it. gelu_tanh uses the
identity 0.5 x (1 + tanh(u)) = x * sigmoid(2u), computed in fp32 (the reference rounds each of its
five ops to the input dtype, so the two agree to a few ulps, not bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_args
from .triton_pdl import pdl_wait

@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, inter, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    y = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_tanh_f32(x):
    """GELU's tanh form of fp32 `x`, as x * sigmoid(2u): shared with the split-K GEMM's epilogue."""
    two_u = 2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)  # 2 sqrt(2 / pi) (x + 0.044715 x^3)
    return x / (1.0 + tl.exp(-two_u))


@triton.jit
def _gelu_tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, gelu_tanh_f32(x).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    shape, inter = x.shape, x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T = x2.shape[0]
    out = torch.empty((T, inter), dtype=x.dtype, device=x.device)
    BLOCK = 1024
    if T and inter:
        _silu_and_mul_kernel[(T, triton.cdiv(inter, BLOCK))](x2, out, x2.stride(0), out.stride(0), inter,
                                                            BLOCK=BLOCK, num_warps=4, **pdl_args(x2))
    return out.view(*shape[:-1], inter)


def gelu_tanh_triton(x: torch.Tensor) -> torch.Tensor:
    xc = x.contiguous()
    out = torch.empty_like(xc)
    n = xc.numel()
    BLOCK = 2048
    if n:
        _gelu_tanh_kernel[(triton.cdiv(n, BLOCK),)](xc, out, n, BLOCK=BLOCK, num_warps=8, **pdl_args(xc))
    return out
