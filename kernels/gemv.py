"""Decode linears at batch 1: y = x @ W.T for one row, with what surrounds it fused.

A decode step at batch 1 is ~130 weight streams (four per layer, plus the head), each a few
microseconds long; the kernels between them (norms, the activation) and the gaps at each kernel
boundary cost a tenth of the step. `fused_linear` folds into one kernel:

    norm_weight given:  x, residual -> RMSNorm(x + residual) before the product, and returns the
                        new residual (x + residual), as `norm.rms_norm` does;
    glu=True:           W is the fused [gate; up] projection [2I, K] and the output is
                        silu(gate) * up [M, I], as `activation.silu_and_mul` of the product.

Two kernels implement it: triton_gemv.py and cuda_gemv.py (CUDA C through CuPy). A `config` with
"backend": "cuda" or "triton" picks one and its tiles (`shardline tune-gemm` writes such configs);
without a config DEFAULT_BACKEND runs. `preferred` is the engine's choice when no tuned table
says otherwise.

int8 and fp8 weights carry a per-row scale (applied in the epilogue). Rounding follows the unfused path:
the normed input, the projections and the activation are rounded to x's dtype where the unfused
kernels round them. The reference below is literally that unfused path.
"""

from __future__ import annotations

import torch

from . import activation, norm, quant
from ._dispatch import use_triton

GEMV_MAX_M = 1
DEFAULT_BACKEND = "cuda"


def _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu, rms_norm, quantized_linear, silu_and_mul):
    res_out = None
    if norm_weight is not None:
        x, res_out = rms_norm(x, norm_weight, eps, residual)
    y = quantized_linear(x, weight, scale, bias) if scale is not None else torch.nn.functional.linear(x, weight, bias)
    return (silu_and_mul(y) if glu else y), res_out


def fused_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None, eps: float = 1e-6,
                     glu: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu,
                    norm.rms_norm_ref, quant.quantized_linear_ref, activation.silu_and_mul_ref)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fused_linear` runs the GEMV kernel for these operands (else: unfused torch ops)."""
    return (x.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and weight.stride(-1) == 1 and use_triton(x))


def preferred(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Run a one-row linear through the GEMV by default: where the CUDA C kernel takes the operands
    (measured faster than cuBLAS over the decode stack, docs/benchmarks.md)."""
    from . import cuda_gemv
    return DEFAULT_BACKEND == "cuda" and fits(x, weight) and cuda_gemv.fits(x, weight, scale, bias)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False,
                 config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, new residual or None). x [M, K]; weight [N, K] (bf16/fp16, or int8/fp8 with scale [N])."""
    if fits(x, weight):
        from . import cuda_gemv
        backend = config.get("backend", "triton") if config else DEFAULT_BACKEND  # tables before "backend": Triton
        if backend == "cuda" and cuda_gemv.fits(x, weight, scale, bias):
            return cuda_gemv.fused_linear_cuda(x, weight, scale, bias, norm_weight, residual, eps, glu, config)
        from .triton_gemv import fused_linear_triton
        tiles = {k: v for k, v in config.items() if k != "backend"} if config and backend == "triton" else None
        return fused_linear_triton(x, weight, scale, bias, norm_weight, residual, eps, glu, tiles)
    return _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu,
                    norm.rms_norm, quant.quantized_linear, activation.silu_and_mul)
