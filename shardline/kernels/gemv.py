"""Decode linears at batch 1: y = x @ W.T for one row, with what surrounds it fused.

A decode step at batch 1 is ~130 weight streams (four per layer, plus the head), each a few
microseconds long; the kernels between them (norms, the activation) and the gaps at each kernel
boundary cost a tenth of the step. `fused_linear` folds into one kernel:

    norm_weight given:  x, residual -> RMSNorm(x + residual) before the product, and returns the
                        new residual (x + residual), as `norm.rms_norm` does;
    glu=True:           W is the fused [gate; up] projection [2I, K] and the output is
                        silu(gate) * up [M, I], as `activation.silu_and_mul` of the product.
    norm_bias given:    the norm is LayerNorm with this bias (GPT-2, GPT-J), as `norm.layer_norm`.
    gelu=True:          GELU of the product, as `activation.gelu_tanh`.
    add given:          add [M, N] goes on the product before the bias: a parallel residual's
                        two partial sums (GPT-J's attention and MLP outputs), added as the
                        unfused path adds them (the product rounded, the sum rounded, the bias).

Two kernels implement it: triton_gemv.py and cuda_gemv.py (CUDA C through CuPy); LayerNorm, GELU
and the addend only the CUDA C one (elsewhere they run unfused). A `config` with
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


def _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu, norm_bias, gelu, add, ops):
    """The unfused path, by `ops`: the reference ops (fused_linear_ref) or the kernels'."""
    rms_norm, layer_norm, quantized_linear, silu_and_mul, gelu_tanh = ops
    res_out = None
    if norm_weight is not None:
        x, res_out = (rms_norm(x, norm_weight, eps, residual) if norm_bias is None
                      else layer_norm(x, norm_weight, norm_bias, eps, residual))
    product_bias = bias if add is None else None
    y = (quantized_linear(x, weight, scale, product_bias) if scale is not None
         else torch.nn.functional.linear(x, weight, product_bias))
    if glu:
        y = silu_and_mul(y)
    elif gelu:
        y = gelu_tanh(y)
    if add is not None:
        y = y + add
        if bias is not None:
            y = y + bias
    return y, res_out


REFERENCE_OPS = (norm.rms_norm_ref, norm.layer_norm_ref, quant.quantized_linear_ref, activation.silu_and_mul_ref,
                 activation.gelu_tanh_ref)
KERNEL_OPS = (norm.rms_norm, norm.layer_norm, quant.quantized_linear, activation.silu_and_mul, activation.gelu_tanh)


def fused_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None, eps: float = 1e-6,
                     glu: bool = False, norm_bias: torch.Tensor | None = None, gelu: bool = False,
                     add: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu, norm_bias, gelu, add, REFERENCE_OPS)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fused_linear` runs the GEMV kernel for these operands (else: unfused torch ops)."""
    return (x.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_M and x.dtype in (torch.bfloat16, torch.float16)
            and weight.stride(-1) == 1 and use_triton(x))


def preferred(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Run a one-row linear through the GEMV by default: where the CUDA C kernel takes the operands
    (measured faster than cuBLAS over the decode stack, docs/benchmarks-history.md)."""
    from . import cuda_gemv
    return DEFAULT_BACKEND == "cuda" and fits(x, weight) and cuda_gemv.fits(x, weight, scale, bias)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False,
                 config: dict | None = None, norm_bias: torch.Tensor | None = None, gelu: bool = False,
                 add: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, new residual or None). x [M, K]; weight [N, K] (bf16/fp16, or int8/fp8 with scale [N])."""
    if norm_bias is not None and norm_weight is None:
        raise ValueError("fused_linear: norm_bias is LayerNorm's bias; pass its norm_weight too")
    if add is not None and (glu or gelu):
        raise ValueError("fused_linear: `add` goes on a plain product (a parallel residual's partial), "
                         "not after SwiGLU or GELU")
    beyond_triton = norm_bias is not None or gelu or add is not None
    if fits(x, weight):
        from . import cuda_gemv
        backend = config.get("backend", "triton") if config else DEFAULT_BACKEND  # tables before "backend": Triton
        if (backend == "cuda" and cuda_gemv.fits(x, weight, scale, bias)
                and all(t is None or t.dtype == x.dtype for t in (norm_bias, add))):
            return cuda_gemv.fused_linear_cuda(x, weight, scale, bias, norm_weight, residual, eps, glu, config,
                                               norm_bias=norm_bias, gelu=gelu, add=add)
        if not beyond_triton:
            from .triton_gemv import fused_linear_triton
            tiles = {k: v for k, v in config.items() if k != "backend"} if config and backend == "triton" else None
            return fused_linear_triton(x, weight, scale, bias, norm_weight, residual, eps, glu, tiles)
    return _unfused(x, weight, scale, bias, norm_weight, residual, eps, glu, norm_bias, gelu, add, KERNEL_OPS)
