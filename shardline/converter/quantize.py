"""int8 weight-only quantization: symmetric, one scale per output channel (row of `[out, in]`)."""

from __future__ import annotations

import torch


def quantize_int8(w: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`w [out, in]` -> (`q` int8 `[out, in]`, `scale [out]` in `scale_dtype`), `w ≈ q * scale[:, None]`.

    `scale = max|w_row| / 127`, rounded to `scale_dtype` before `q` is computed, so that the
    engine's dequantization with the stored scale is the one the rounding was chosen for.
    """
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127).to(scale_dtype)
    divisor = scale.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)  # all-zero rows stay zero
    q = torch.round(w / divisor[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale

