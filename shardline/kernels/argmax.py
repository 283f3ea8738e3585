"""Greedy sampling's argmax over each row of the logits [B, V]: the first maximum on ties.

In the batch-64 generate loop on an H200, torch's argmax over the 33 MB of fp32 logits ran as a
20.7 us reduce and a 4.8 us second one, a few blocks a row; the Triton kernel (triton_argmax.py)
spreads each row over chunks of 4,096 columns and took 10.9 us of the step's critical path
(`python -m benchmarks.profile_decode --batch 64 --generate`, docs/benchmarks-history.md). Where
the head runs the split-K kernel (decode at 2-64 rows) its epilogue leaves each tile's maximum
instead and only the second pass runs (`quant.GreedyIds`). The reference is torch's own argmax,
which also returns the first maximum.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)


def argmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B]: each row's first maximum, written into `out` [B] when given (a decode graph's
    persistent `sampled`: no copy kernel after it)."""
    if out is not None and (out.shape != x.shape[:1] or out.dtype != torch.int64):
        raise ValueError(f"out must be int64 [{x.shape[0]}], got {out.dtype} {list(out.shape)}")
    if use_triton(x) and x.shape[0] and x.shape[1]:
        from .triton_argmax import argmax_rows_triton
        return argmax_rows_triton(x, out=out)
    return argmax_rows_ref(x) if out is None else out.copy_(argmax_rows_ref(x))
