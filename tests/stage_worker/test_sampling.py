"""The sampler: greedy rows take the first maximum (shardline/kernels/argmax.py, tested in tests/kernels), sampled rows
draw from the filtered distribution."""

from __future__ import annotations

import pytest
import torch

from shardline.sampler import argmax_rows, sample
from shardline.sampling import SamplingParams

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU; the same ops run on the CPU above")])]


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
