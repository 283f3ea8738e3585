"""RMSNorm / LayerNorm with an optional fused residual add.

Contract (both): given x [T, H] and optionally residual [T, H], returns
    (norm(x + residual), x + residual)   when residual is given
    (norm(x), None)                      otherwise
so a decoder layer carries the un-normalised stream without a separate add kernel.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * out.to(x.dtype), residual


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if residual is not None:
        x = x + residual
        residual = x
    out = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    return out.to(x.dtype), residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if use_triton(x):
        from .triton_norm import rms_norm_triton
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if use_triton(x):
        from .triton_norm import layer_norm_triton
        return layer_norm_triton(x, weight, bias, eps, residual)
    return layer_norm_ref(x, weight, bias, eps, residual)
