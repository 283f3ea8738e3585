"""The ring GEMM (kernels/gluon_ring.py): Gluon for Hopper, checked against the reference on the GPU
at odd shapes; on the CPU its public op runs the reference and its operand rules are checked."""

from __future__ import annotations

import pytest
import torch

from kernel_testing import assert_close, assert_fold_close, assert_graph_replays_deterministic, fold_case
from shardline.kernels.quant import linear_ref, ring_config, ring_fits, ring_linear, ring_plan


def _skip_unless_hopper(device: str) -> None:
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the ring GEMM is Gluon for Hopper (TMA, wgmma, a producer warp); Triton's interpreter "
                    "does not run Gluon, and the CPU path (the reference) is checked below")
    pytest.importorskip("triton.experimental.gluon", reason="the ring GEMM is written in Gluon")


def test_cpu_path_is_the_reference():
    x, w, bias = torch.randn(5, 64), torch.randn(96, 64), torch.randn(96)
    torch.testing.assert_close(ring_linear(x, w, bias), linear_ref(x, w, None, bias))
    torch.testing.assert_close(ring_linear(x, w, None, glu=True), linear_ref(x, w, None, None, glu=True))
    assert ring_linear(x, w, out_dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="even row count"):
        ring_linear(x, w[:95], glu=True)


def test_operand_rules_name_the_problem():
    bf = torch.bfloat16
    assert ring_fits(torch.randn(64, 128, dtype=bf), torch.randn(96, 128, dtype=bf)) is None
    assert "at most 64" in ring_fits(torch.randn(65, 128, dtype=bf), torch.randn(96, 128, dtype=bf))
    assert "bf16 or fp16" in ring_fits(torch.randn(4, 128), torch.randn(96, 128))
    assert "bf16 or fp16" in ring_fits(torch.randn(4, 128, dtype=bf), torch.randn(96, 128, dtype=torch.float16))
    assert "16-byte aligned" in ring_fits(torch.randn(4, 128, dtype=bf), torch.randn(96, 136, dtype=bf)[:, 1:129])
    assert "multiple of 16 bytes" in ring_fits(torch.randn(4, 100, dtype=bf), torch.randn(96, 100, dtype=bf))


def test_bad_configs_name_the_key_or_value():
    x, w = torch.randn(5, 64), torch.randn(96, 64)
    assert ring_linear(x, w, None, {"BLOCK_N": 64, "EARLY": 0}).shape == (5, 96)
    for bad, needle in (({"BLOCKN": 64}, "BLOCKN"), ({"BLOCK_N": 96}, "BLOCK_N=96"), ({"STAGES": 0}, "STAGES=0"),
                        ({"SPLIT_K": 0}, "SPLIT_K=0"), ({"EARLY": -1}, "EARLY=-1"), ({"SUB": 12}, "SUB=12"),
                        ({"SUB": 16, "WAVES": 0}, "WAVES=0"), ({"SUB": 16, "SPLIT_K": 2}, "does not split K"),
                        ({"MAXNREG": 100}, "MAXNREG=100"), ({"MAXNREG": 256}, "MAXNREG=256"),
                        ({"LATE": "yes"}, "LATE='yes'"),
                        ({"BLOCK_N": 256, "BLOCK_K": 128, "STAGES": 4}, "KB of shared memory")):
        with pytest.raises(ValueError, match=needle):
            ring_linear(x, w, None, bad)


def test_balanced_form_deals_every_program_the_same_runs_give_or_take_one():
    """gate/up of Llama-3-8B on 132 multiprocessors: the tiled form's 224 programs are 1.7 waves;
    the balanced form's 132 programs take 6 or 7 runs of 16 rows each, in one 128-row tile."""
    plan = ring_plan(ring_config({"SUB": 16, "BLOCK_K": 64, "STAGES": 5}), 14336, 4096, True, 2, 132)
    assert (plan["BLOCK_N"], plan["BOX"], plan["grid"], plan["runs"]) == (128, 16, (132, 1), 896)
    R, P = plan["runs"], plan["programs"]
    runs = [(p + 1) * R // P - p * R // P for p in range(P)]  # the kernel's split
    assert sum(runs) == R and max(runs) - min(runs) <= 1 and max(runs) * 16 <= plan["BLOCK_N"]
    tiled = ring_plan(ring_config({"BLOCK_N": 128, "BLOCK_K": 128, "STAGES": 3}), 14336, 4096, True, 2, 132)
    assert tiled["grid"] == (224, 1) and tiled["BLOCK_N"] == tiled["BOX"] == 64
    head = ring_config({"SUB": 16, "BLOCK_K": 64, "STAGES": 3})
    with pytest.raises(ValueError, match="above wgmma's 256; raise WAVES"):
        ring_plan(head, 128256, 4096, False, 2, 132)
    assert ring_plan(dict(head, WAVES=4), 128256, 4096, False, 2, 132)["grid"] == (528, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 64])
@pytest.mark.parametrize("N,K", [(200, 1000), (256, 4096), (3996, 512)])
@pytest.mark.parametrize("config", [dict(BLOCK_N=128, BLOCK_K=128, STAGES=3, SPLIT_K=1),
                                    dict(BLOCK_N=64, BLOCK_K=64, STAGES=4, SPLIT_K=3),
                                    dict(BLOCK_N=128, BLOCK_K=128, STAGES=3, SPLIT_K=1, EARLY=0),
                                    dict(BLOCK_N=32, BLOCK_K=128, STAGES=6, SPLIT_K=4, EARLY=2),
                                    dict(SUB=16, BLOCK_K=64, STAGES=4),
                                    dict(SUB=8, BLOCK_K=128, STAGES=3, EARLY=1),
                                    dict(BLOCK_N=64, BLOCK_K=128, STAGES=3, SPLIT_K=2, MAXNREG=128),
                                    dict(SUB=16, BLOCK_K=64, STAGES=3, WAVES=2, MAXNREG=128)])
@pytest.mark.parametrize("glu", [False, True])
def test_ring_linear_matches_the_reference(device, M, N, K, config, glu):
    """N = 200 is no multiple of the tile (the last gate tile reads up rows whose columns the store
    drops); K = 1000 no multiple of BLOCK_K (TMA zero-fills); 1 and 5 rows leave most of x's 64-row
    tile to TMA's zero fill; SPLIT_K = 3 or 4 leaves a split of fewer (or no) K tiles. The balanced
    form (SUB): at N = 3996 and SUB = 8, 500 runs over 132 programs are 3 or 4 a program in a
    32-row tile, so boxes past a program's runs go out of bounds (zero-filled, no bytes read),
    and the last run is half past N."""
    _skip_unless_hopper(device)
    dtype = torch.bfloat16
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = (torch.randn(2 * N if glu else N, K, device=device) * 0.05).to(dtype)
    bias = torch.randn(w.shape[0], device=device, dtype=dtype) if M % 2 else None
    want = linear_ref(x, w, None, bias, glu=glu)
    for attempt in range(2):  # the tile counters must be back at zero after each call
        assert_close(ring_linear(x, w, bias, config, glu=glu), want, f"ring {config} glu={glu}, call {attempt + 1}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ring_linear_writes_fp32_from_its_sums(device, dtype):
    _skip_unless_hopper(device)
    x = torch.randn(7, 512, device=device, dtype=dtype)
    w = (torch.randn(320, 512, device=device) * 0.05).to(dtype)
    for split_k in (1, 2):
        out = ring_linear(x, w, None, dict(BLOCK_N=64, BLOCK_K=128, STAGES=3, SPLIT_K=split_k), out_dtype=torch.float32)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, x.float() @ w.float().T, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("glu", [False, True])
def test_ring_linear_replays_in_a_graph(device, glu):
    """Descriptors are launch arguments and the split partials meet through counters: a captured
    graph replays the same bits, call after call."""
    _skip_unless_hopper(device)
    w = (torch.randn(2 * 1024 if glu else 1024, 4096, device=device) * 0.02).to(torch.bfloat16)
    x = torch.randn(64, 4096, device=device, dtype=torch.bfloat16)
    cfg = dict(BLOCK_N=128, BLOCK_K=128, STAGES=3, SPLIT_K=2)
    assert_graph_replays_deterministic(lambda x: ring_linear(x, w, None, cfg, glu=glu), x,
                                       lambda x: linear_ref(x, w, None, None, glu=glu), f"ring glu={glu}")


@pytest.mark.gpu
def test_operands_it_cannot_take_are_a_clear_error(device):
    _skip_unless_hopper(device)
    x = torch.randn(65, 128, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="at most 64"):
        ring_linear(x, torch.randn(96, 128, device=device, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [5, 64])
@pytest.mark.parametrize("config", [dict(BLOCK_N=64, BLOCK_K=128, STAGES=6, SPLIT_K=1),
                                    dict(BLOCK_N=64, BLOCK_K=64, STAGES=4, SPLIT_K=3),
                                    dict(SUB=16, BLOCK_K=64, STAGES=4)])
@pytest.mark.parametrize("fold", ["norm", "residual", "both", "norm-glu", "ln", "ln-residual", "ln-glu"])
def test_ring_epilogue_folds_the_norm_and_the_residual(device, M, config, fold):
    """The ring's ROW_NORM (1 / rms from the partial sums of squares, loaded by the consumers
    after the PDL wait) and RESIDUAL (the stream's next value and its tiles' sums of squares)
    against the reference, tiled, K split and balanced, N = 200 no multiple of the tile; `ln-*`
    a LayerNorm's (CENTRED, SUMS), as GPT-J's products run them."""
    _skip_unless_hopper(device)
    s, w, kw, glu, _, want = fold_case(fold, M, 200, 1024, torch.bfloat16, device, parts=7)
    for attempt in range(2):
        got = ring_linear(s, w, None, config, glu=glu, **kw)
        assert_fold_close(got, want, f"ring {config} {fold}, call {attempt + 1}")


def test_cpu_fold_returns_the_stream_and_its_sums_of_squares():
    from shardline.kernels.norm import RowNorm
    s, w, residual = torch.randn(5, 64), torch.randn(96, 64), torch.randn(5, 96)
    out, ss = ring_linear(s, w, None, residual=residual, norm=RowNorm(s.pow(2).sum(-1)[None], 1e-5))
    want = s / s.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() @ w.T + residual
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ss[0], out.pow(2).sum(-1))
    norm = RowNorm.of(torch.stack([s.pow(2).sum(-1)[None], s.sum(-1)[None]]), 1e-5)
    out, partials = ring_linear(s, w, None, residual=residual, norm=norm, centre=w.sum(1), sums=True)
    want = torch.nn.functional.layer_norm(s, (64,), eps=1e-5) @ w.T + residual
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(partials[1, 0], out.sum(-1))
