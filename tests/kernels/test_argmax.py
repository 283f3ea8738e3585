"""Greedy sampling's argmax (kernels/argmax.py): the first maximum of each row, ties included."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the Triton kernel); the reference runs on the CPU")])]

from shardline.kernels.argmax import _chunks, argmax_rows, argmax_rows_ref


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [128256, 50400, 32000, 512, 1000, 257, 7])
def test_two_pass_argmax_equals_argmax(vocab, device):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(5, vocab, generator=g).to(device)
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


def test_chunks_divide_the_vocabulary_and_stay_wide():
    assert _chunks(128256) == 256 and _chunks(512) == 2
    assert _chunks(257) == 1  # prime: one pass
    for vocab in (128256, 50400, 32000, 151936, 1000):
        c = _chunks(vocab)
        assert vocab % c == 0 and (c == 1 or vocab // c >= 256)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_take_the_first_maximum_across_and_within_chunks(device):
    vocab = 128256
    step = vocab // _chunks(vocab)
    x = torch.zeros(4, vocab, device=device)
    x[0, [step * 3 + 7, step * 9 + 1, 5 * step]] = 2.0  # across chunks: the lowest index wins
    x[1, [step * 4 + 10, step * 4 + 3]] = 1.0  # within one chunk
    x[2, -1] = 3.0  # the last entry
    x[3] = -float("inf")
    x[3, 0] = -float("inf")
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist() == [step * 3 + 7, step * 4 + 3, vocab - 1, 0]


def test_non_contiguous_rows():
    x = torch.randn(3, 1024 + 64)[:, :1024]  # the engine slices the padded vocabulary off
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
