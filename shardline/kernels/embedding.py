"""A step's first model kernel (in a decode graph, after step_io's take of the step): each row's
token id (the host's, or one the previous step sampled on the device), its embedding row, and that
row's sum of squares.

A decode step of a one-stage model used to open with six small kernels: four resolving the ids
(`torch.where(src >= 0, sampled[src.clamp(min=0)], ids)`), the embedding gather, and the first
layer's RMSNorm. Here they are one: the sums of squares are what the first layer's qkv product
needs to scale its rows by 1 / rms in its epilogue (the fold, model/transformer.py), as every
later layer's already does with the sums the product before it leaves.

Contract: ids [T] int64; with `src` [T] and `sampled`, row r's id is sampled[src[r]] where
src[r] >= 0, else ids[r]. Returns (weight[id] [T, H], the rows' sums of squares [1, T] fp32 as
`norm.RowNorm` takes them, or None unless `sum_squares`).
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton
from .norm import sum_squares_ref


def resolve_ids(ids: torch.Tensor, src: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """Each row's token id [T]: sampled[src] where src >= 0 (a token the previous step sampled on
    the device), else the host's id."""
    return torch.where(src >= 0, sampled[src.clamp(min=0)], ids)


def embed_rows_ref(ids: torch.Tensor, weight: torch.Tensor, src: torch.Tensor | None = None,
                   sampled: torch.Tensor | None = None, sum_squares: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if src is not None:
        ids = resolve_ids(ids, src, sampled)
    x = torch.nn.functional.embedding(ids, weight)
    return x, (sum_squares_ref(x) if sum_squares else None)


def embed_rows(ids: torch.Tensor, weight: torch.Tensor, src: torch.Tensor | None = None,
               sampled: torch.Tensor | None = None, sum_squares: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if (src is None) != (sampled is None):
        raise ValueError("src and sampled go together: src names rows of sampled")
    if use_triton(weight) and ids.numel():
        from .triton_embedding import embed_rows_triton
        return embed_rows_triton(ids, weight, src, sampled, sum_squares)
    return embed_rows_ref(ids, weight, src, sampled, sum_squares)
