"""The stream-K decode GEMM (kernels/triton_streamk.py) against the unfused torch path.

Odd shapes, and fixed program counts that cut the (tile, k-tile) iterations unevenly, so that
tiles are finished whole by one program, and by two, three or more programs' partial sums.
"""

from __future__ import annotations

import pytest
import torch

from kernel_testing import assert_close, assert_graph_replays_deterministic, skip_interpreted_bf16_dot
from shardline.kernels import _dispatch, activation
from shardline.kernels.quant import quantize_fp8_ref, quantize_int8_ref, streamk_linear
from shardline.kernels.quant import linear_ref as _reference


def _problem(M, N, K, dtype, device, weights, glu, with_bias):
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = torch.randn((2 * N if glu else N), K, device=device) * 0.05
    scale = None
    if weights == "int8":
        w, scale = quantize_int8_ref(w, dtype)
    elif weights == "fp8":
        w, scale = quantize_fp8_ref(w, dtype)
    else:
        w = w.to(dtype)
    bias = torch.randn(w.shape[0], device=device, dtype=dtype) if with_bias else None
    return x, w, scale, bias


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K,programs", [(2, 200, 400, None), (64, 256, 384, 3), (17, 96, 256, 5),
                                            (64, 192, 520, 7), (33, 300, 512, 4), (8, 130, 128, 1)])
@pytest.mark.parametrize("weights", ["x", "int8"])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("tma", [0, 1])
def test_streamk_linear(device, dtype, M, N, K, programs, weights, glu, tma):
    from shardline.kernels.triton_streamk import streamk_linear_triton
    skip_interpreted_bf16_dot(device, dtype)
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    x, w, scale, bias = _problem(M, N, K, dtype, device, weights, glu, with_bias=M % 2 == 1)
    cfg = dict(BLOCK_M=16 if M <= 16 else 64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=2, PREFETCH=2, TMA=tma)
    if programs:
        cfg["PROGRAMS"] = programs
    want = _reference(x, w, scale, bias, glu)
    for attempt in range(2):  # the tile counters must be back at zero after each call
        assert_close(streamk_linear_triton(x, w, scale, bias, glu, cfg), want,
                     f"stream-K {M}x{N}x{K} {weights} glu={glu} programs={programs}, call {attempt + 1}")


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(64, 6144, 4096), (64, 4096, 14336), (16, 2 * 14336, 4096), (5, 4096, 4096)])
@pytest.mark.parametrize("glu", [False, True])
def test_streamk_default_tiles_llama_shapes(device, M, N, K, glu):
    """The default tiles (one program a multiprocessor, PDL prefetch on Hopper) at the real shapes."""
    if device != "cuda":
        pytest.skip("Llama-sized products are checked on the GPU only (minutes in the interpreter)")
    from shardline.kernels.triton_streamk import streamk_linear_triton
    x, w, scale, bias = _problem(M, N // 2 if glu else N, K, torch.bfloat16, device, "x", glu, False)
    assert_close(streamk_linear_triton(x, w, glu=glu), _reference(x, w, None, None, glu), "stream-K default tiles")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_streamk_fp8_weights(device, dtype):
    if device != "cuda":
        pytest.skip("fp8 weights are checked on the GPU (Triton's interpreter has no e4m3)")
    from shardline.kernels.triton_streamk import streamk_linear_triton
    x, w, scale, bias = _problem(48, 300, 640, dtype, device, "fp8", True, True)
    assert_close(streamk_linear_triton(x, w, scale, bias, glu=True, config=dict(
        BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3, PROGRAMS=6)),
        _reference(x, w, scale, bias, True), "stream-K fp8 glu")


@pytest.mark.gpu
def test_streamk_is_deterministic_and_graph_capturable(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    from shardline.kernels.triton_streamk import streamk_linear_triton
    x, w, _, _ = _problem(64, 4096, 4096, torch.bfloat16, device, "x", False, False)
    assert_graph_replays_deterministic(lambda x: streamk_linear_triton(x, w), x,
                                       lambda x: torch.nn.functional.linear(x, w), "stream-K")


def test_streamk_rejects_what_it_cannot_run():
    x = torch.randn(65, 32)
    with pytest.raises(ValueError, match="at most 64 rows"):
        streamk_linear(x, torch.randn(16, 32))
    with pytest.raises(ValueError, match="even row count"):
        streamk_linear(x[:4], torch.randn(15, 32), glu=True)


def test_streamk_public_op_runs_the_reference_on_cpu():
    x, w = torch.randn(5, 64), torch.randn(48, 64)
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    want = activation.silu_and_mul_ref(x @ w.T)
    torch.testing.assert_close(streamk_linear(x, w, glu=True), want)
