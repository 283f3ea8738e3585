from __future__ import annotations

import pytest
import torch

from kernel_testing import (assert_close, assert_fold_close, assert_graph_replays_deterministic, fold_case,
                            fold_problem, skip_interpreted_bf16_dot)
from shardline.kernels import _dispatch
from shardline.kernels.norm import RowNorm
from shardline.kernels.quant import (linear_ref, quantize_fp8_ref, quantize_int8_ref, quantized_linear,
                                     quantized_linear_ref, small_m_linear)


def test_quantized_linear_ref_matches_float64():
    x, w = torch.randn(7, 100, dtype=torch.float64), torch.randn(96, 100, dtype=torch.float64)
    q, scale = quantize_int8_ref(w)
    bias = torch.randn(96, dtype=torch.float64)
    want = x @ (q.double() * scale[:, None]).T + bias
    torch.testing.assert_close(quantized_linear_ref(x, q, scale, bias), want)


def test_quantize_int8_ref_round_trip_error_is_half_a_step():
    w = torch.randn(96, 100)
    q, scale = quantize_int8_ref(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


def test_public_name_runs_the_reference_on_cpu():
    x, (q, s) = torch.randn(3, 32), quantize_int8_ref(torch.randn(16, 32))
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    assert torch.equal(quantized_linear(x, q, s), quantized_linear_ref(x, q, s))


def _problem(M, N, K, dtype, device, with_bias):
    x = torch.randn(M, K, device=device, dtype=dtype)
    q = torch.randint(-127, 128, (N, K), device=device, dtype=torch.int8)
    scale = (torch.rand(N, device=device) * 0.02 + 0.001).to(dtype)
    bias = torch.randn(N, device=device, dtype=dtype) if with_bias else None
    return x, q, scale, bias


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 96, 64), (7, 100, 96), (16, 256, 100), (20, 96, 512), (33, 96, 512),
                                   (64, 200, 256), (100, 96, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_quantized_linear_triton(device, dtype, M, N, K, with_bias):
    skip_interpreted_bf16_dot(device, dtype)
    x, q, scale, bias = _problem(M, N, K, dtype, device, with_bias)
    assert_close(quantized_linear(x, q, scale, bias), quantized_linear_ref(x, q, scale, bias), "quantized_linear")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 96, 64), (7, 100, 96), (33, 96, 512), (100, 96, 64)])
def test_fp8_weights_run_the_same_kernels(device, dtype, M, N, K):
    if device != "cuda":
        pytest.skip("fp8 weights are checked on the GPU (Triton's interpreter has no e4m3)")
    x = torch.randn(M, K, device=device, dtype=dtype)
    q, scale = quantize_fp8_ref(torch.randn(N, K, device=device) * 0.05, dtype)
    bias = torch.randn(N, device=device, dtype=dtype)
    assert_close(quantized_linear(x, q, scale, bias), quantized_linear_ref(x, q, scale, bias), "fp8 quantized_linear")


def test_quantize_fp8_ref_keeps_three_mantissa_bits():
    w = torch.randn(96, 100)
    w[3] = 0.0  # an all-zero row stays zero
    q, scale = quantize_fp8_ref(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (96,)
    assert q.float().abs().amax(dim=1)[torch.arange(96) != 3].eq(448).all(), "each row's largest maps to 448"
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= (w.abs() * 2 ** -4).clamp_min(scale[:, None] * 2 ** -10) + 1e-7).all()
    assert q[3].float().eq(0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2, 3, 8])
@pytest.mark.parametrize("block_m,block_n,block_k", [(16, 64, 128), (16, 32, 256), (64, 64, 64)])
@pytest.mark.parametrize("K", [384, 400])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tma", [0, 1])
def test_int8_linear_split_k_configs(device, split_k, block_m, block_n, block_k, K, dtype, tma):
    from shardline.kernels.triton_quant import quantized_linear_triton
    skip_interpreted_bf16_dot(device, dtype)
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    x, q, scale, bias = _problem(3, 200, K, dtype, device, True)
    cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, num_warps=4,
               num_stages=3, TMA=tma)
    want = quantized_linear_ref(x, q, scale, bias)
    for attempt in range(2):  # the tile counters must be back at zero after each call
        assert_close(quantized_linear_triton(x, q, scale, bias, config=cfg), want,
                     f"quantized_linear {cfg}, call {attempt + 1}")


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("weights", ["x", "int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(5, 96, 384), (64, 200, 400)])
@pytest.mark.parametrize("tma", [0, 1])
def test_small_m_linear_glu(device, split_k, weights, dtype, M, N, K, tma):
    """SwiGLU in the split-K kernel's epilogue: silu(gate) * up of the fused [gate; up] weight,
    against the product and then the activation; with TMA loads too (N = 200 is no multiple of
    the tile, so the last gate tile reads up rows whose columns the store drops)."""
    skip_interpreted_bf16_dot(device, dtype)
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    if weights == "fp8" and device != "cuda":
        pytest.skip("fp8 weights are checked on the GPU (Triton's interpreter has no e4m3)")
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = torch.randn(2 * N, K, device=device) * 0.05
    scale = None
    if weights != "x":
        w, scale = (quantize_int8_ref if weights == "int8" else quantize_fp8_ref)(w, dtype)
    else:
        w = w.to(dtype)
    bias = torch.randn(2 * N, device=device, dtype=dtype) if M % 2 else None
    cfg = dict(BLOCK_M=16 if M <= 16 else 64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=split_k, num_warps=4, num_stages=3,
               TMA=tma)
    want = linear_ref(x, w, scale, bias, glu=True)
    for attempt in range(2):  # the tile counters must be back at zero after each call
        assert_close(small_m_linear(x, w, scale, bias, cfg, glu=True), want,
                     f"split-K glu {weights} split {split_k}, call {attempt + 1}")


@pytest.mark.gpu
@pytest.mark.parametrize("ahead", [3, 5, 40])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("tma", [0, 1])
def test_split_k_l2_prefetch_ahead_changes_no_bit(device, ahead, split_k, glu, tma):
    """AHEAD asks L2 for weight tiles further on (clamped to the split's last; 40 is past every
    split's end): the sums are the same bits as without it, and still the reference's."""
    if device != "cuda":
        pytest.skip("the L2 prefetch is inline PTX, which Triton's interpreter does not run")
    N, K = 200, 1000  # no multiple of the tile: the clamp and the masks at the edges
    w = (torch.randn(2 * N if glu else N, K, device=device) * 0.05).to(torch.bfloat16)
    x = torch.randn(64, K, device=device, dtype=torch.bfloat16)
    cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, SPLIT_K=split_k, num_warps=4, num_stages=3, TMA=tma)
    want = small_m_linear(x, w, None, None, cfg, glu=glu)
    assert_close(want, linear_ref(x, w, None, None, glu=glu), f"split-K glu={glu} tma={tma}")
    for attempt in range(2):  # the tile counters must be back at zero after each call
        got = small_m_linear(x, w, None, None, dict(cfg, AHEAD=ahead), glu=glu)
        assert torch.equal(got, want), f"AHEAD={ahead} changed the output (call {attempt + 1})"


@pytest.mark.gpu
def test_int8_linear_split_k_is_deterministic_and_graph_capturable(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    x, q, scale, _ = _problem(1, 4096, 4096, torch.bfloat16, device, False)
    assert_graph_replays_deterministic(lambda x: quantized_linear(x, q, scale), x,
                                       lambda x: quantized_linear_ref(x, q, scale), "split-K quantized_linear")


@pytest.mark.gpu
@pytest.mark.parametrize("glu", [False, True])
def test_small_m_linear_tma_replays_in_a_graph(device, glu):
    """The descriptors of TMA loads are launch arguments: a captured graph replays them."""
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    w = (torch.randn(2 * 1024 if glu else 1024, 4096, device=device) * 0.02).to(torch.bfloat16)
    x = torch.randn(64, 4096, device=device, dtype=torch.bfloat16)
    cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=4, TMA=1)
    assert_graph_replays_deterministic(lambda x: small_m_linear(x, w, None, None, cfg, glu=glu), x,
                                       lambda x: linear_ref(x, w, None, None, glu=glu), f"split-K TMA glu={glu}")


@pytest.mark.gpu
def test_int8_linear_keeps_leading_dims(device):
    x, q, scale, _ = _problem(6, 96, 64, torch.float32, device, False)
    out = quantized_linear(x.view(2, 3, 64), q, scale)
    assert out.shape == (2, 3, 96)
    assert_close(out.view(6, 96), quantized_linear_ref(x, q, scale), "quantized_linear on [2, 3, K]")


def _biased_problem(M, N, K, dtype, device, weights, spread):
    """x [M, K], a weight [N, K] of x's dtype or int8 with its scale, and a bias."""
    x = torch.randn(M, K, device=device, dtype=dtype)
    w, scale = torch.randn(N, K, device=device) * spread, None
    if weights == "int8":
        w, scale = quantize_int8_ref(w, dtype)
    else:
        w = w.to(dtype)
    return x, w, scale, torch.randn(N, device=device, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["x", "int8"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_small_m_linear_writes_fp32_from_its_sums(device, weights, split_k):
    """out_dtype=float32 (the logits): the kernel stores its fp32 sums; rounded to x's dtype they
    are exactly what the x-dtype call writes, and they sit closer to the fp32 reference."""
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    x, w, scale, bias = _biased_problem(7, 200, 256, dtype, device, weights, 0.05)
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, SPLIT_K=split_k, num_warps=4, num_stages=2)
    wide = small_m_linear(x, w, scale, bias, cfg, out_dtype=torch.float32)
    narrow = small_m_linear(x, w, scale, bias, cfg)
    assert wide.dtype == torch.float32 and narrow.dtype == dtype
    assert torch.equal(wide.to(dtype), narrow), "one fp32 sum, rounded once"
    want = linear_ref(x.float(), w.float(), scale.float() if scale is not None else None, bias.float())
    assert (wide - want).abs().max() <= (narrow.float() - want).abs().max()
    with pytest.raises(ValueError, match="out_dtype is for the plain product"):
        small_m_linear(x, torch.cat([w, w]), None if scale is None else torch.cat([scale, scale]), None, cfg,
                       glu=True, out_dtype=torch.float32)


def test_outgrown_tile_counters_stay_allocated():
    """A captured graph keeps the raw address of the counters it ran with: growing the buffer for
    a larger grid must not free the old one (CPU tensors stand in for the device's)."""
    pytest.importorskip("triton", reason="the counters live in the Triton kernel's module")
    from shardline.kernels import triton_quant
    dev = torch.device("cpu")
    saved = triton_quant._counters.pop(dev, None), list(triton_quant._outgrown)
    try:
        small = triton_quant._tile_counters(dev, 10)
        assert small.numel() == 4096 and not small.any()
        assert triton_quant._tile_counters(dev, 100) is small, "a grid that fits reuses the buffer"
        large = triton_quant._tile_counters(dev, 5000)
        assert large.numel() == 5000 and large is not small
        assert any(t is small for t in triton_quant._outgrown), "the outgrown buffer is kept alive"
    finally:
        triton_quant._counters.pop(dev, None)
        if saved[0] is not None:
            triton_quant._counters[dev] = saved[0]
        triton_quant._outgrown[:] = saved[1]


def test_fold_reference_is_the_norm_then_the_product_then_the_add():
    """The fold's algebra, on the CPU path every device shares: RMSNorm(s) * g @ W.T equals
    (s @ (W * g).T) / rms(s), and the residual product returns s' = product + residual with the
    sums of squares of s'."""
    from shardline.kernels.norm import rms_norm_ref
    s, norm, g, w, residual = fold_problem(6, 40, 96, torch.float64, "cpu")
    if _dispatch.use_triton(s):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    normed, _ = rms_norm_ref(s, g, 1e-5)
    folded = small_m_linear(s, w * g, None, None, {}, norm=norm)
    torch.testing.assert_close(folded, normed @ w.T)
    out, ss = small_m_linear(normed, w, None, None, {}, residual=residual)
    torch.testing.assert_close(out, normed @ w.T + residual)
    torch.testing.assert_close(ss.sum(0), out.pow(2).sum(-1))
    with pytest.raises(ValueError, match="residual add follows a plain product"):
        small_m_linear(s, torch.cat([w, w]), None, None, {}, glu=True, residual=residual)


def test_layer_norm_fold_reference_centres_the_rows():
    """A LayerNorm's fold on the CPU path: (LayerNorm(s) * g + b) @ W.T equals
    ((s @ (W * g).T) - mean(s) * rowsum(W * g)) / std(s) + W b, the mean and std from the sums
    and squares a residual product leaves with `sums` ([2, tiles, M]); and the errors that name
    what is missing."""
    from shardline.kernels.norm import layer_norm_ref
    s, norm, g, w, residual = fold_problem(6, 40, 96, torch.float64, "cpu", layer_norm=True)
    if _dispatch.use_triton(s):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    b = torch.randn(96, dtype=torch.float64)
    normed, _ = layer_norm_ref(s, g, b, 1e-5)
    wg = w * g
    folded = small_m_linear(s, wg, None, w @ b, {}, norm=norm, centre=wg.float().sum(1))
    torch.testing.assert_close(folded, normed @ w.T, rtol=1e-5, atol=1e-5)
    out, partials = small_m_linear(normed, w, None, None, {}, residual=residual, sums=True)
    assert partials.shape == (2, 1, 6)
    torch.testing.assert_close(partials[0].sum(0), out.pow(2).sum(-1))
    torch.testing.assert_close(partials[1].sum(0), out.sum(-1))
    again = RowNorm.of(partials, 1e-5)
    torch.testing.assert_close(again.rstd(40), 1 / (out.var(-1, unbiased=False) + 1e-5).sqrt())
    with pytest.raises(ValueError, match="needs the product's centre"):
        small_m_linear(s, wg, None, None, {}, norm=norm)
    with pytest.raises(ValueError, match=r"centre must be fp32 \[40\]"):
        small_m_linear(s, wg, None, None, {}, norm=norm, centre=torch.zeros(39))
    with pytest.raises(ValueError, match="only with the residual add"):
        small_m_linear(s, wg, None, None, {}, sums=True)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("M,N,K", [(5, 200, 384), (64, 96, 512)])
@pytest.mark.parametrize("fold", ["norm", "residual", "both", "norm-glu", "ln", "ln-residual", "ln-both", "ln-glu",
                                  "ln-gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tma", [0, 1])
def test_split_k_epilogue_folds_the_norm_and_the_residual(device, split_k, M, N, K, fold, dtype, tma):
    """The split-K kernel's ROW_NORM and RESIDUAL epilogues against the reference, whatever the
    split (the last split's epilogue) and the producer's partial count (5 here, 64 in Llama);
    `ln-*`, a LayerNorm's (CENTRED: the rows centred by the weight's row sums; SUMS: the stream's
    sums left after its squares), as GPT-J's qkv, up (with GELU) and down run them."""
    skip_interpreted_bf16_dot(device, dtype)
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    s, w, kw, glu, gelu, want = fold_case(fold, M, N, K, dtype, device)
    cfg = dict(BLOCK_M=16 if M <= 16 else 64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=split_k, num_warps=4, num_stages=3,
               TMA=tma)
    for attempt in range(2):  # the tile counters must be back at zero after each call
        got = small_m_linear(s, w, None, None, cfg, glu=glu, gelu=gelu, **kw)
        assert_fold_close(got, want, f"split-K {fold}, call {attempt + 1}")
        if kw["residual"] is not None:
            assert got[1].shape[-2] == -(-N // 64), f"one partial a tile of 64 columns, got {tuple(got[1].shape)}"


def _head_problem(M, N, K, dtype, device):
    """A head-like product whose weight repeats rows, so that rows' largest logits tie exactly."""
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = (torch.randn(N, K, device=device) * 0.05).to(dtype)
    if M > 1:  # row 1's largest logit is column 3, tied with 5 (same tile) and N - 5 (another)
        w[3] = x[1] * 0.1
        w[5], w[N - 5] = w[3], w[3]
    w[7] = x[0] * 0.1  # row 0's is column 7 ...
    w[N - 2] = w[7]  # ... tied with column N - 2, which a greedy over the first N - 3 columns leaves out
    return x, w


def test_greedy_ids_reference_and_errors():
    from shardline.kernels.quant import GreedyIds
    x, w = _head_problem(4, 50, 32, torch.float32, "cpu")
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    out = torch.full((4,), -1, dtype=torch.int64)
    y = small_m_linear(x, w, None, None, {}, out_dtype=torch.float32, greedy=GreedyIds(out, 47))
    assert torch.equal(out, y[:, :47].argmax(-1)) and out[:2].tolist() == [7, 3]
    with pytest.raises(ValueError, match="greedy ids come from a plain product"):
        small_m_linear(x, w, None, None, {}, greedy=GreedyIds(torch.empty(3, dtype=torch.int64), 47))
    with pytest.raises(ValueError, match="greedy ids come from a plain product"):
        small_m_linear(x, torch.cat([w, w]), None, None, {}, glu=True, greedy=GreedyIds(out, 47))


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("M,N,K,cols", [(5, 1000, 256, 997), (64, 700, 384, 700), (1, 130, 128, 129)])
@pytest.mark.parametrize("tma", [0, 1])
def test_split_k_epilogue_leaves_each_rows_greedy_id(device, split_k, M, N, K, cols, tma):
    """The ARGMAX epilogue (a head's greedy ids without a pass over its logits): torch's first
    maximum over the first `cols` columns of the logits the same call writes, ties across tiles
    and within one included, with the RowNorm fold as the head runs it."""
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    from shardline.kernels.quant import GreedyIds
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x, w = _head_problem(M, N, K, dtype, device)
    norm = RowNorm(x.float().pow(2).sum(-1)[None].contiguous(), 1e-5)
    cfg = dict(BLOCK_M=16 if M <= 16 else 64, BLOCK_N=64, BLOCK_K=128, SPLIT_K=split_k, num_warps=4, num_stages=3,
               TMA=tma)
    for kw in ({}, {"norm": norm}):
        out = torch.full((M + 2,), -1, dtype=torch.int64, device=device)
        logits = small_m_linear(x, w, None, None, cfg, out_dtype=torch.float32, greedy=GreedyIds(out[:M], cols), **kw)
        assert out[:M].cpu().tolist() == logits[:, :cols].cpu().argmax(-1).tolist(), kw
        assert out[M:].cpu().tolist() == [-1, -1]
        if cols < N - 2:
            assert out[0] == 7, "the tie with a column past `cols` is not taken"
        if M > 1:
            assert out[1] == 3, "the first of three tied columns, one in another tile"


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2])
def test_split_k_head_skips_the_logits_nobody_reads(device, monkeypatch, split_k):
    """GreedyIds.store (a decode graph's all-greedy step): with 0 there the greedy ids are the same
    and the logits buffer is left as it was (here: every element -7, as allocated); with 1 the
    logits are written. The flag is read on the device, so one captured graph serves both."""
    from shardline.kernels.quant import GreedyIds
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    M, N, K, cols = 5, 700, 256, 697
    x, w = _head_problem(M, N, K, dtype, device)
    norm = RowNorm(x.float().pow(2).sum(-1)[None].contiguous(), 1e-5)
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=split_k, num_warps=4, num_stages=3)
    reference = torch.full((M,), -1, dtype=torch.int64, device=device)
    logits = small_m_linear(x, w, None, None, cfg, out_dtype=torch.float32, norm=norm,
                            greedy=GreedyIds(reference, cols))
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(-7))  # what the buffer held
    for wanted in (0, 1):
        ids = torch.full((M,), -1, dtype=torch.int64, device=device)
        store = torch.tensor([wanted], dtype=torch.int64, device=device)
        out = small_m_linear(x, w, None, None, cfg, out_dtype=torch.float32, norm=norm,
                             greedy=GreedyIds(ids, cols, store))
        assert torch.equal(ids, reference), wanted
        if wanted:
            assert torch.equal(out, logits)
        else:
            assert bool((out == -7).all()), "the logits were written though no one reads them"


def test_gelu_reference_and_errors():
    from shardline.kernels.activation import gelu_tanh_ref
    x, w = torch.randn(3, 32, dtype=torch.float64), torch.randn(20, 32, dtype=torch.float64)
    bias = torch.randn(20, dtype=torch.float64)
    if _dispatch.use_triton(x):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    torch.testing.assert_close(small_m_linear(x, w, None, bias, {}, gelu=True), gelu_tanh_ref(x @ w.T + bias))
    for kw in ({"glu": True}, {"out_dtype": torch.float32}, {"residual": torch.zeros(3, 20, dtype=torch.float64)}):
        with pytest.raises(ValueError, match="gelu follows a plain product|residual add follows|out_dtype is for"):
            small_m_linear(x, torch.cat([w, w]) if "glu" in kw else w, None, None, {}, gelu=True, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("weights", ["x", "int8"])
@pytest.mark.parametrize("tma", [0, 1])
def test_split_k_epilogue_applies_gelu_where_the_unfused_path_would(device, split_k, weights, tma):
    """GELU in the epilogue (GPT-J's up projection): the product with its bias rounded to x's dtype,
    then the activation kernel's formula, so the same call without it, then activation.gelu_tanh,
    gives the same values."""
    if tma and device != "cuda":
        pytest.skip("tensor-memory-accelerator loads need a Hopper GPU")
    from shardline.kernels.activation import gelu_tanh
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    M, N = 7, 300
    x, w, scale, bias = _biased_problem(M, N, 384, dtype, device, weights, 0.1)
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=split_k, num_warps=4, num_stages=3, TMA=tma)
    fused = small_m_linear(x, w, scale, bias, cfg, gelu=True)
    unfused = gelu_tanh(small_m_linear(x, w, scale, bias, cfg))
    assert fused.dtype == dtype and fused.shape == (M, N)
    assert_close(fused, unfused, "GELU in the epilogue against the activation kernel after", tol=1e-6)
