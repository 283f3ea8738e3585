"""What a linear hands to cuBLAS's epilogue instead of a kernel of its own (model/layers.py): the
sum GPT-J's parallel residual takes (down accumulating onto o's output, o carrying down's bias),
fp32 logits straight from bf16 operands, GELU after the bias. On the CPU the plain products
compute the same, so the arithmetic is checked here; the GPU tests check cuBLAS's forms."""

from __future__ import annotations

import pytest
import torch

from shardline.gemm_tuning import GemmTable, key
from shardline.kernels import activation
from shardline.model.layers import Linear, cublas_linear

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLAS's epilogues need a CUDA GPU; "
                         "on the CPU cublas_linear is F.linear, checked below")


def _linear(n=24, k=40, bias=True, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype) if bias else None
    return Linear(w, b)


def test_accumulate_adds_the_product_into_onto_without_the_bias():
    lin = _linear()
    x, onto = torch.randn(5, 40), torch.randn(5, 24)
    want = onto + x @ lin.weight.T
    out = lin.accumulate(x, onto)
    assert out.data_ptr() == onto.data_ptr(), "the sum is written into onto"
    torch.testing.assert_close(out, want)


def test_accumulate_falls_back_to_the_add_where_a_table_picks_another_kernel():
    lin = _linear()
    table = GemmTable("cpu", {key(24, 40, torch.float32, torch.float32): {8: {"impl": "triton", "config": {}}}})
    lin.gemms = table
    x, onto = torch.randn(5, 40), torch.randn(5, 24)
    want = onto + x @ lin.weight.T
    torch.testing.assert_close(lin.accumulate(x, onto.clone()), want)


def test_a_carried_bias_replaces_the_linears_own():
    lin, other = _linear(), torch.randn(24)
    x = torch.randn(3, 40)
    torch.testing.assert_close(lin(x, add_bias=False, bias=other), x @ lin.weight.T + other)
    torch.testing.assert_close(lin(x, add_bias=False), x @ lin.weight.T)
    torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)


def test_cublas_linear_off_the_gpu_is_the_plain_product():
    lin = _linear()
    x = torch.randn(3, 40)
    y, fused_gelu = cublas_linear(x, lin.weight, lin.bias, torch.float32, gelu=True)
    assert not fused_gelu
    torch.testing.assert_close(y, x @ lin.weight.T + lin.bias)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_logits_come_from_cublas_unrounded(dtype):
    lin = _linear(n=1000, k=256, bias=False, device="cuda", dtype=dtype)
    x = torch.randn(37, 256, device="cuda", dtype=dtype)
    y = lin(x, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    # fp32 sums, not rounded to the operands' dtype (that would be off by ~|y| / 256)
    torch.testing.assert_close(y, x.float() @ lin.weight.float().T, rtol=1e-4, atol=1e-3)


@gpu
def test_a_biased_head_keeps_the_conversion():
    lin = _linear(n=1000, k=256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(37, 256, device="cuda", dtype=torch.bfloat16)
    y = lin(x, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, torch.nn.functional.linear(x, lin.weight, lin.bias).float())


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_in_cublas_epilogue_matches_the_activation_kernel(dtype):
    lin = _linear(n=512, k=256, device="cuda", dtype=dtype, seed=1)
    x = torch.randn(70, 256, device="cuda", dtype=dtype) * 0.1
    y, fused_gelu = cublas_linear(x, lin.weight, lin.bias, gelu=True)
    assert fused_gelu and y.dtype == dtype
    want = activation.gelu_tanh_ref(x.float() @ lin.weight.float().T + lin.bias.float())
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lin.gelu(x).float(), want, rtol=2e-2, atol=2e-2)


@gpu
def test_accumulate_on_the_gpu_is_cublas_beta_one():
    lin = _linear(n=256, k=128, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    onto = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    want = onto.float() + x.float() @ lin.weight.float().T
    torch.testing.assert_close(lin.accumulate(x, onto).float(), want, rtol=2e-2, atol=5e-2)
