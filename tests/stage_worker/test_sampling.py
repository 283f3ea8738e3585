"""The sampler's two-pass argmax equals torch's one-pass argmax, first maximum on ties included."""

from __future__ import annotations

import pytest
import torch

from shardline.sampler import _argmax_chunks, argmax_rows, sample
from shardline.sampling import SamplingParams

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU; the same ops run on the CPU above")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [128256, 50400, 32000, 512, 1000, 257, 7])
def test_two_pass_argmax_equals_argmax(vocab, device):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(5, vocab, generator=g).to(device)
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


def test_chunks_divide_the_vocabulary_and_stay_wide():
    assert _argmax_chunks(128256) == 256 and _argmax_chunks(512) == 2
    assert _argmax_chunks(257) == 1  # prime: one pass
    for vocab in (128256, 50400, 32000, 151936, 1000):
        c = _argmax_chunks(vocab)
        assert vocab % c == 0 and (c == 1 or vocab // c >= 256)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_take_the_first_maximum_across_and_within_chunks(device):
    vocab = 128256
    step = vocab // _argmax_chunks(vocab)
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


def test_sample_greedy_and_random_rows_use_it():
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(), SamplingParams(temperature=0.8, seed=3)]
    out = sample(x, params, torch.tensor([5, 5]))
    assert out[0].item() == x[0].argmax().item()
    assert 0 <= out[1].item() < 4096
    assert torch.equal(out, sample(x, params, torch.tensor([5, 5])))  # a pure function of seed, position


@pytest.mark.parametrize("mixed", [False, True], ids=["all-greedy", "mixed"])
def test_a_precomputed_greedy_argmax_gives_what_sample_computes(mixed):
    """A decode graph hands the sampler its argmax; the ids must be those sample() draws alone,
    and an all-greedy batch returns that tensor itself (no sampler kernel runs)."""
    x = torch.randn(4, 3000, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(), SamplingParams(temperature=0.9, top_k=40, top_p=0.8, seed=5) if mixed
              else SamplingParams(), SamplingParams(), SamplingParams(temperature=1.2, seed=9) if mixed
              else SamplingParams()]
    positions = torch.tensor([3, 8, 1, 4])
    greedy = argmax_rows(x)
    got = sample(x, params, positions, greedy=greedy)
    assert torch.equal(got, sample(x, params, positions))
    assert (got is greedy) == (not mixed)
