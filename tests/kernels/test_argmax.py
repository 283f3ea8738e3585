"""Greedy sampling's argmax (kernels/argmax.py): the first maximum of each row, ties included."""

from __future__ import annotations

import pytest
import torch

from shardline.kernels.argmax import argmax_rows, argmax_rows_ref


def _rows_with_ties(B: int, V: int, device: str) -> torch.Tensor:
    x = torch.randn(B, V, device=device)
    x[0, V // 3] = x[0, V - 1] = 100.0  # a tie across chunks: the first wins
    x[min(1, B - 1), 5:9] = 50.0  # a tie inside one chunk
    return x


@pytest.mark.parametrize("V", [1000, 128256, 1021])
def test_reference_is_torchs_first_maximum(V):
    x = _rows_with_ties(4, V, "cpu")
    assert torch.equal(argmax_rows_ref(x), x.argmax(dim=-1))
    assert argmax_rows_ref(x)[0] == V // 3


@pytest.mark.gpu
@pytest.mark.parametrize("B,V", [(1, 128256), (64, 128256), (3, 1000), (5, 4097), (2, 7)])
def test_triton_argmax_matches_the_reference(device, B, V):
    x = _rows_with_ties(B, V, device)
    got = argmax_rows(x)
    assert got.dtype == torch.int64 and got.shape == (B,)
    assert torch.equal(got.cpu(), argmax_rows_ref(x.cpu()))
