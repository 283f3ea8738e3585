"""Triton argmax of each row of [B, V]: chunks of BLOCK columns reduce in parallel (B x C programs,
each its chunk's maximum and the first column holding it), then one program a row picks the first
chunk holding the row's maximum. Imported only when a CUDA (or interpreted) tensor arrives.
NaN compares as nothing here (torch's argmax would pick it); logits are finite."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2, pdl_args
from .triton_pdl import pdl_wait


@triton.jit
def _chunk_kernel(x_ptr, val_ptr, idx_ptr, V, stride_x, C, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    best = tl.max(x, axis=0)
    first = tl.min(tl.where(x == best, cols, V), axis=0)  # the first column holding it
    tl.store(val_ptr + row * C + chunk, best)
    tl.store(idx_ptr + row * C + chunk, first)


@triton.jit
def _pick_kernel(val_ptr, idx_ptr, out_ptr, C, C_P2: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, C_P2)
    pdl_wait(USE_PDL)
    vals = tl.load(val_ptr + row * C + c, mask=c < C, other=float("-inf"))
    best = tl.max(vals, axis=0)
    first = tl.min(tl.where(vals == best, c, C), axis=0)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * C + first).to(tl.int64))


def argmax_rows_triton(x: torch.Tensor, block: int = 4096, out: torch.Tensor | None = None) -> torch.Tensor:
    B, V = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    block = min(block, next_pow2(V))
    C = triton.cdiv(V, block)
    vals = torch.empty((B, C), dtype=torch.float32, device=x.device)
    idx = torch.empty((B, C), dtype=torch.int32, device=x.device)
    if out is None:
        out = torch.empty(B, dtype=torch.int64, device=x.device)
    _chunk_kernel[(B, C)](x, vals, idx, V, x.stride(0), C, BLOCK=block, num_warps=8, **pdl_args(x))
    return pick_rows(vals, idx, out)


def pick_rows(vals: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[r] = idx[r, c] of the first chunk c holding max(vals[r]): the second pass, also after a
    product whose epilogue left each tile's maximum (triton_quant.tile_argmax)."""
    B, C = vals.shape
    _pick_kernel[(B,)](vals, idx, out, C, C_P2=max(next_pow2(C), 2), num_warps=1, **pdl_args(vals))
    return out
