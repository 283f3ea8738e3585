"""Greedy sampling's argmax (kernels/argmax.py): the Triton kernel gives torch's first maximum of
each row, ties across and within its 4,096-column chunks included. On the CPU the op is torch's
argmax itself, so these run on a GPU (or in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from shardline.kernels.argmax import argmax_rows

CHUNK = 4096  # triton_argmax.argmax_rows_triton's columns a program


@pytest.mark.gpu
@pytest.mark.parametrize("B,V", [(1, 128256), (64, 128256), (3, 1000), (5, 4097), (2, 7), (5, 50400)])
def test_triton_argmax_is_torchs(device, B, V):
    x = torch.randn(B, V, device=device)
    x[0, V // 3] = x[0, V - 1] = 100.0  # a tie across chunks: the first wins
    x[min(1, B - 1), 5:9] = 50.0  # a tie inside one chunk
    got = argmax_rows(x)
    assert got.dtype == torch.int64 and got.shape == (B,)
    assert torch.equal(got.cpu(), x.cpu().argmax(dim=-1))
    assert got[0] == V // 3


@pytest.mark.gpu
def test_ties_take_the_first_maximum_across_and_within_chunks(device):
    vocab = 128256
    x = torch.zeros(4, vocab, device=device)
    x[0, [CHUNK * 3 + 7, CHUNK * 9 + 1, 5 * CHUNK]] = 2.0  # across chunks: the lowest index wins
    x[1, [CHUNK * 4 + 10, CHUNK * 4 + 3]] = 1.0  # within one chunk
    x[2, -1] = 3.0  # the last entry, in the partial last chunk
    x[3] = -float("inf")  # all equal: the first
    assert argmax_rows(x).tolist() == [CHUNK * 3 + 7, CHUNK * 4 + 3, vocab - 1, 0]


@pytest.mark.gpu
def test_non_contiguous_rows(device):
    x = torch.randn(3, 1024 + 64, device=device)[:, :1024]  # the engine slices the padded vocabulary off
    assert torch.equal(argmax_rows(x).cpu(), x.cpu().argmax(dim=-1))


@pytest.mark.gpu
def test_writes_into_out(device):
    x = torch.randn(6, 3000, device=device)
    out = torch.full((8,), -7, dtype=torch.int64, device=device)
    got = argmax_rows(x, out=out[:6])
    assert got.data_ptr() == out.data_ptr()
    assert out[:6].cpu().tolist() == x.cpu().argmax(dim=-1).tolist() and out[6:].cpu().tolist() == [-7, -7]


def test_out_of_the_wrong_shape_is_an_error():
    with pytest.raises(ValueError, match=r"out must be int64 \[4\]"):
        argmax_rows(torch.randn(4, 10), out=torch.empty(3, dtype=torch.int64))
    out = torch.empty(4, dtype=torch.int64)
    x = torch.randn(4, 10)
    assert argmax_rows(x, out=out) is out and torch.equal(out, x.argmax(-1))
