"""int8 weight-only linear: y = x @ (w_int8 * scale[:, None]).T + bias.

w_int8 [out, in] int8 with per-output-channel scale [out] (see docs/shard-format.md). The
reference dequantises; the GPU kernel streams int8 and scales in the epilogue, halving the bytes a
memory-bound decode step reads.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton


def int8_linear_ref(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    w = w_int8.to(x.dtype) * scale.to(x.dtype)[:, None]
    return torch.nn.functional.linear(x, w, bias)


def quantize_int8_ref(w: torch.Tensor, scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel: `w [out, in]` -> (int8 `[out, in]`, `scale [out]`), w ≈ q * scale.

    `scale = max|w_row| / 127`, rounded to `scale_dtype` (default: w's dtype) before q is
    computed, so the engine's dequantisation with the stored scale is the one the rounding chose.
    The converter and the benchmarks' random weights both quantise through this function.
    """
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / 127).to(scale_dtype or w.dtype)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)  # all-zero rows stay zero
    q = torch.round(wf / divisor[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_linear(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton(x):
        from .triton_quant import int8_linear_triton
        return int8_linear_triton(x, w_int8, scale, bias)
    return int8_linear_ref(x, w_int8, scale, bias)


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                   bias: torch.Tensor | None, config: dict) -> torch.Tensor:
    """The split-K small-M kernel with a tuned `config` (shardline tune-gemm), for int8 (with
    scale) or x-dtype weights; the plain product where Triton does not run."""
    if use_triton(x):
        from .triton_quant import small_m_linear_triton
        return small_m_linear_triton(x, weight, scale, bias, config)
    if scale is not None:
        return int8_linear_ref(x, weight, scale, bias)
    return torch.nn.functional.linear(x, weight, bias)
