from __future__ import annotations

import pytest
import torch

from kernel_testing import REL_TOL, assert_close, assert_exact
from shardline.kernels import _dispatch
from shardline.kernels.norm import layer_norm, layer_norm_ref, rms_norm, rms_norm_ref


def _naive_rms(x, w, eps):
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w.double()


def _naive_layer(x, w, b, eps):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w.double() + b.double()


@pytest.mark.parametrize("hidden", [96, 100])
def test_rms_norm_ref_matches_naive(hidden):
    x, r, w = torch.randn(7, hidden), torch.randn(7, hidden), torch.randn(hidden)
    out, res = rms_norm_ref(x, w, 1e-6, r)
    assert torch.equal(res, x + r), "the new residual must be x + residual, carried to the next layer"
    torch.testing.assert_close(out.double(), _naive_rms(x + r, w, 1e-6), rtol=1e-5, atol=1e-5)
    out, res = rms_norm_ref(x, w, 1e-6)
    assert res is None
    torch.testing.assert_close(out.double(), _naive_rms(x, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hidden", [96, 100])
def test_layer_norm_ref_matches_naive(hidden):
    x, r, w, b = torch.randn(7, hidden), torch.randn(7, hidden), torch.randn(hidden), torch.randn(hidden)
    out, res = layer_norm_ref(x, w, b, 1e-5, r)
    assert torch.equal(res, x + r)
    torch.testing.assert_close(out.double(), _naive_layer(x + r, w, b, 1e-5), rtol=1e-5, atol=1e-5)


def test_public_names_run_the_reference_on_cpu():
    x, r, w, b = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32), torch.randn(32)
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    for got, want in [(rms_norm(x, w, 1e-6, r), rms_norm_ref(x, w, 1e-6, r)),
                      (layer_norm(x, w, b, 1e-5, r), layer_norm_ref(x, w, b, 1e-5, r))]:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 96), (5, 100), (3, 4096), (1, 5120)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm_triton(device, dtype, shape, with_residual):
    x = torch.randn(shape, device=device, dtype=dtype)
    r = torch.randn(shape, device=device, dtype=dtype) if with_residual else None
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    assert _dispatch.use_triton(x)
    out, res = rms_norm(x, w, 1e-6, r)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, r)
    assert_close(out, ref_out, "rms_norm output")
    if with_residual:
        assert_exact(res, ref_res, "the new residual (x + residual, rounded once)")
    else:
        assert res is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_triton_fp32_weight_on_strided_rows(device, dtype):
    x = torch.randn(7, 200, device=device, dtype=dtype)[:, :100]  # rows 200 apart
    w = torch.randn(100, device=device, dtype=torch.float32)
    out, _ = rms_norm(x, w, 1e-5)
    assert_close(out, rms_norm_ref(x, w, 1e-5)[0], "rms_norm, fp32 weight, strided x", REL_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 96), (5, 100), (3, 4096)])
def test_layer_norm_triton(device, dtype, shape):
    x, r = torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype)
    w, b = torch.randn(shape[-1], device=device, dtype=dtype), torch.randn(shape[-1], device=device, dtype=dtype)
    out, res = layer_norm(x, w, b, 1e-5, r)
    ref_out, ref_res = layer_norm_ref(x, w, b, 1e-5, r)
    assert_close(out, ref_out, "layer_norm output")
    assert_exact(res, ref_res, "the new residual (x + residual, rounded once)")
    out, res = layer_norm(x, w, b, 1e-5)
    assert_close(out, layer_norm_ref(x, w, b, 1e-5)[0], "layer_norm without residual")
    assert res is None
