from __future__ import annotations

import math

import pytest
import torch

from kernel_testing import assert_close
from shardline.kernels import _dispatch
from shardline.kernels.activation import gelu_tanh, gelu_tanh_ref, silu_and_mul, silu_and_mul_ref


def test_silu_and_mul_ref_matches_naive():
    x = torch.randn(7, 2 * 48, dtype=torch.float64)
    gate, up = x[:, :48], x[:, 48:]
    torch.testing.assert_close(silu_and_mul_ref(x), gate / (1 + torch.exp(-gate)) * up)


def test_gelu_tanh_ref_matches_erf_gelu_closely():
    # gelu_new is the tanh approximation of erf-GELU: within 1e-3 everywhere.
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    assert (gelu_tanh_ref(x) - exact).abs().max() < 1e-3


def test_public_names_run_the_reference_on_cpu():
    x = torch.randn(3, 64)
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    assert torch.equal(silu_and_mul(x), silu_and_mul_ref(x))
    assert torch.equal(gelu_tanh(x), gelu_tanh_ref(x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 2 * 48), (1, 2 * 100), (5, 2 * 1500)])
def test_silu_and_mul_triton(device, dtype, shape):
    x = 3 * torch.randn(shape, device=device, dtype=dtype)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), "silu_and_mul")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 96), (3, 5, 100), (2, 3000)])
def test_gelu_tanh_triton(device, dtype, shape):
    x = 3 * torch.randn(shape, device=device, dtype=dtype)
    # The reference rounds each of its five ops to dtype; the kernel rounds once, so allow more.
    tol = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    assert_close(gelu_tanh(x), gelu_tanh_ref(x), "gelu_tanh", tol)
