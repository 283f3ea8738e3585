"""Greedy sampling's argmax over each row of the logits [B, V]: the first maximum on ties.

torch's one-pass argmax of a few long rows runs on a few blocks (one 128,256-wide row took 27 us
on an H200), and its reduction of 64 such rows read the 33 MB of fp32 logits at ~1.3 TB/s. The
Triton kernel (triton_argmax.py) spreads each row over chunks, as the reference does in torch.
"""

from __future__ import annotations

import functools

import torch

from ._dispatch import use_triton


@functools.lru_cache(maxsize=None)
def _chunks(vocab: int) -> int:
    """Chunks of the reference's two passes: the most that divide `vocab`, at most 256 of at least 256."""
    for c in range(min(256, vocab // 256), 1, -1):
        if vocab % c == 0:
            return c
    return 1


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) of a [B, V] tensor in two passes: the maximum of each of C chunks of a row
    (B x C outputs in parallel), then of the chunk maxima; the first maximum on ties."""
    B, V = x.shape
    chunks = _chunks(V)
    if chunks == 1:
        return x.argmax(dim=-1)
    values, within = x.reshape(B, chunks, V // chunks).max(dim=-1)  # first maximum of each chunk
    chunk = values.argmax(dim=-1, keepdim=True)  # the first chunk holding the row's maximum
    return (chunk * (V // chunks) + within.gather(1, chunk))[:, 0]


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """int64 [B]: each row's first maximum."""
    if use_triton(x) and x.shape[0] and x.shape[1]:
        from .triton_argmax import argmax_rows_triton
        return argmax_rows_triton(x)
    return argmax_rows_ref(x)
