"""Triton embedding lookup with the step's pending ids resolved and the rows' sums of squares
(embedding.py): one program a row. Imported only when a CUDA (or interpreted) tensor arrives."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2, pdl_args
from .triton_pdl import pdl_wait


@triton.jit
def _embed_kernel(ids_ptr, src_ptr, sampled_ptr, w_ptr, out_ptr, ss_ptr, H, stride_w, stride_out,
                  HAS_SRC: tl.constexpr, SUM_SQUARES: tl.constexpr, BLOCK: tl.constexpr,
                  USE_PDL: tl.constexpr):
    row = tl.program_id(0)
    pdl_wait(USE_PDL)  # `sampled` is the step before's last write
    token = tl.load(ids_ptr + row)
    if HAS_SRC:
        src = tl.load(src_ptr + row)
        if src >= 0:
            token = tl.load(sampled_ptr + src)
    ss = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, H, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(w_ptr + token.to(tl.int64) * stride_w + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, x, mask=mask)
        if SUM_SQUARES:
            xf = x.to(tl.float32)
            ss += xf * xf
    if SUM_SQUARES:
        tl.store(ss_ptr + row, tl.sum(ss, axis=0))


def embed_rows_triton(ids: torch.Tensor, weight: torch.Tensor, src: torch.Tensor | None,
                      sampled: torch.Tensor | None, sum_squares: bool
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    T, H = ids.numel(), weight.shape[1]
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    out = torch.empty((T, H), dtype=weight.dtype, device=weight.device)
    ss = torch.empty((1, T), dtype=torch.float32, device=weight.device) if sum_squares else out
    has_src = src is not None
    _embed_kernel[(T,)](ids, src if has_src else ids, sampled if has_src else ids, weight, out, ss, H,
                        weight.stride(0), out.stride(0), HAS_SRC=has_src, SUM_SQUARES=sum_squares,
                        BLOCK=min(next_pow2(H), 4096), num_warps=4, **pdl_args(weight))
    return out, (ss if sum_squares else None)
