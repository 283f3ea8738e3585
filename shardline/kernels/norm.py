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
    """A norm left to the product after it, from the partial statistics [P, M] (fp32) of its input
    stream's rows that the product writing the stream left in its epilogue (one per column tile of
    it), and the norm's eps. The norm's weight is folded into the next product's weight (columns
    times weight), and for a LayerNorm its bias into that product's bias, so what remains is a
    row factor: 1 / rms for an RMSNorm; for a LayerNorm (`sums` given) 1 / std after taking out
    the mean's share, which the product holds as its weight's row sums (`Linear.centre`)."""

    sum_squares: torch.Tensor
    eps: float
    sums: torch.Tensor | None = None  # a LayerNorm's: the rows' partial sums [P, M]

    @classmethod
    def of(cls, partials: torch.Tensor, eps: float) -> "RowNorm":
        """The RowNorm of a residual product's partials: [P, M] sums of squares, or [2, P, M]
        (`sums=True`) those and the sums, for a LayerNorm."""
        if partials.dim() == 3:
            return cls(partials[0], eps, partials[1])
        return cls(partials, eps)

    def mean(self, width: int) -> torch.Tensor | None:
        """The mean of each row of a stream `width` wide, [M] fp32, for a LayerNorm; else None."""
        return None if self.sums is None else self.sums.sum(0) / width

    def rstd(self, width: int) -> torch.Tensor:
        """1 / rms (RMSNorm) or 1 / std (LayerNorm: E[x^2] - mean^2, floored at 0) of each row of
        a stream `width` wide: [M] fp32."""
        second = self.sum_squares.sum(0) / width
        if self.sums is not None:
            second = (second - self.mean(width) ** 2).clamp_min(0.0)
        return torch.rsqrt(second + self.eps)


def sum_squares_ref(s: torch.Tensor, sums: bool = False) -> torch.Tensor:
    """The one partial [1, M] of each row's sum of squares, as RowNorm takes them; with `sums`,
    [2, 1, M]: those and the rows' sums (a LayerNorm's, RowNorm.of)."""
    s2 = s.reshape(-1, s.shape[-1])
    f = s2.to(torch.promote_types(s2.dtype, torch.float32))
    squares = f.pow(2).sum(-1)[None, :]
    return torch.stack([squares, f.sum(-1)[None, :]]) if sums else squares
