"""Triton RMSNorm / LayerNorm with the residual add fused in: one read of x (and residual), one
write of the output (and the new residual). Imported only when a CUDA tensor arrives.

Rounding follows the reference exactly where it is cheap: x + residual is rounded to x's dtype
before it is normalised (it is also the stream carried to the next layer), the normalised value is
rounded to x's dtype before the weight multiplies it, and the product is rounded to the output
dtype. Sums are fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2, pdl_args
from .triton_pdl import pdl_wait


@triton.jit
def _norm_kernel(x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr,
                 stride_x, stride_res, stride_out, stride_res_out, H, eps,
                 IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like the reference's add
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if IS_RMS:
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
        normed = (xf * inv).to(x.dtype).to(tl.float32)
        y = w.to(tl.float32) * normed
    else:
        mean = tl.sum(xf, axis=0) / H
        diff = tl.where(mask, xf - mean, 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / H + eps)
        y = diff * inv * w.to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _norm(x, weight, bias, eps, residual, is_rms, out_dtype):
    shape, H = x.shape, x.shape[-1]
    x2 = _rows(x)
    T = x2.shape[0]
    out = torch.empty((T, H), dtype=out_dtype, device=x.device)
    res2 = _rows(residual) if residual is not None else x2
    res_out = torch.empty_like(x2, memory_format=torch.contiguous_format) if residual is not None else out
    BLOCK = max(next_pow2(H), 16)
    num_warps = min(max(BLOCK // 512, 1), 16)
    if T:
        _norm_kernel[(T,)](x2, res2, weight, bias if bias is not None else weight, out, res_out,
                           x2.stride(0), res2.stride(0), out.stride(0), res_out.stride(0), H, eps,
                           IS_RMS=is_rms, HAS_RESIDUAL=residual is not None,
                           HAS_BIAS=bias is not None, BLOCK=BLOCK, num_warps=num_warps, **pdl_args(x2))
    return out.view(shape), (res_out.view(shape) if residual is not None else None)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None):
    return _norm(x, weight, None, eps, residual, True, torch.promote_types(weight.dtype, x.dtype))


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                      residual: torch.Tensor | None = None):
    return _norm(x, weight, bias, eps, residual, False, x.dtype)
