"""RMSNorm / LayerNorm with an optional fused residual add.

Contract (both): given x [T, H] and optionally residual [T, H], returns
    (norm(x + residual), x + residual)   when residual is given
    (norm(x), None)                      otherwise
so a decoder layer carries the un-normalised stream without a separate add kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class RowNorm:
    """An RMSNorm left to the product after it: the rows of its input stream scale by 1 / rms,
    from the partial sums of their squares [P, M] (fp32) that the product writing the stream left
    in its epilogue (one per column tile of it), and the norm's eps. The norm's weight is folded
    into the next product's weight (columns times weight), so the scale is all that remains."""

    sum_squares: torch.Tensor
    eps: float

    def rstd(self, width: int) -> torch.Tensor:
        """1 / rms of each row of a stream `width` wide: [M] fp32."""
        return torch.rsqrt(self.sum_squares.sum(0) / width + self.eps)


def sum_squares_ref(s: torch.Tensor) -> torch.Tensor:
    """The one partial [1, M] of each row's sum of squares, as RowNorm takes them."""
    s2 = s.reshape(-1, s.shape[-1])
    return s2.to(torch.promote_types(s2.dtype, torch.float32)).pow(2).sum(-1)[None, :]
