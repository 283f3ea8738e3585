"""The decode GEMV (kernels/gemv.py): the fused kernel against the unfused reference path."""

from __future__ import annotations

import pytest
import torch

from kernel_testing import assert_close
from shardline.kernels import _dispatch
from shardline.kernels.gemv import fits, fused_linear, fused_linear_ref
from shardline.kernels.quant import WEIGHT_ONLY


def test_reference_is_the_unfused_path():
    x, res = torch.randn(2, 48), torch.randn(2, 48)
    w, nw = torch.randn(40, 48), torch.rand(48) + 0.5
    y, r = fused_linear_ref(x, w, norm_weight=nw, residual=res, eps=1e-5, glu=True)
    h = x + res
    normed = nw * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5))
    gate, up = (normed @ w.T).chunk(2, dim=-1)
    torch.testing.assert_close(r, h)
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up)


def test_reference_layer_norm_gelu_and_addend():
    """GPT-J's and GPT-2's fusions, against the unfused ops written out: LayerNorm with its bias,
    GELU after the product and its bias; and a parallel residual's addend, which goes on before
    the bias (the partial sums add, then the bias: the order TP's all-reduce imposes)."""
    import math
    x, res = torch.randn(1, 48), torch.randn(1, 48)
    w, nw, nb, b = torch.randn(40, 48), torch.rand(48) + 0.5, torch.randn(48), torch.randn(40)
    y, r = fused_linear_ref(x, w, None, b, norm_weight=nw, residual=res, eps=1e-5, norm_bias=nb, gelu=True)
    h = x + res
    normed = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5) * nw + nb
    z = normed @ w.T + b
    torch.testing.assert_close(r, h)
    torch.testing.assert_close(y, 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))))
    a = torch.randn(1, 40)
    y, r = fused_linear_ref(x, w, None, b, add=a)
    torch.testing.assert_close(y, (x @ w.T + a) + b)
    assert r is None


def test_fused_linear_names_what_it_cannot_fuse():
    x, w = torch.randn(1, 32), torch.randn(16, 32)
    with pytest.raises(ValueError, match="norm_bias is LayerNorm's bias; pass its norm_weight"):
        fused_linear(x, w, norm_bias=torch.zeros(32))
    with pytest.raises(ValueError, match="not after SwiGLU or GELU"):
        fused_linear(x, torch.randn(32, 32), glu=True, add=torch.zeros(1, 16))
    with pytest.raises(ValueError, match="not after SwiGLU or GELU"):
        fused_linear(x, w, gelu=True, add=torch.zeros(1, 16))


def test_fp32_and_batches_above_one_take_the_unfused_path():
    w = torch.randn(16, 32)
    assert not fits(torch.randn(1, 32), w)  # fp32 (and no GPU here)
    assert not fits(torch.randn(2, 32, dtype=torch.bfloat16), w.bfloat16())


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(40, 96), (200, 300), (1000, 1100)])
@pytest.mark.parametrize("quant", ["none", "int8-weight-only", "fp8-weight-only"], ids=["dense", "int8", "fp8"])
@pytest.mark.parametrize("fuse", ["plain", "norm", "norm_res", "norm_res_glu", "glu_bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gemv_matches_the_unfused_path(device, N, K, quant, fuse, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("interpreted, bf16 conversions truncate (the errors add up coherently); fp16 runs")
    if quant == "fp8-weight-only" and device == "cpu":
        pytest.skip("fp8 weights are checked on the GPU (Triton's interpreter has no e4m3)")
    x, w, scale, kw = _fused_case(device, N, K, quant, fuse, dtype)
    assert fits(x, w) or not _dispatch.triton_available()
    y, r = fused_linear(x, w, scale, **kw)
    y_ref, r_ref = fused_linear_ref(x, w, scale, **kw)
    # int8/fp8: the reference rounds each dequantised weight to x's dtype; the kernel scales in fp32.
    assert_close(y, y_ref, f"gemv {fuse}", tol=2e-2 if quant != "none" else None)
    if "res" in fuse:
        assert torch.equal(r, r_ref), "the new residual x + residual is not exact"
    else:
        assert r is None and r_ref is None


def _fused_case(device, N, K, quant, fuse, dtype):
    """(x, w, scale, kwargs) of one fused_linear case."""
    x = torch.randn(1, K, device=device, dtype=dtype)
    w = (torch.randn(2 * N if "glu" in fuse else N, K, device=device) * K ** -0.5).to(dtype)
    scale = None
    if quant != "none":
        w, scale = WEIGHT_ONLY[quant][1](w)
    kw = {"glu": "glu" in fuse}
    if "norm" in fuse or "ln" in fuse:
        kw["norm_weight"] = (torch.rand(K, device=device) + 0.5).to(dtype)
        kw["eps"] = 1e-5
    if "ln" in fuse:  # LayerNorm, on an input whose mean is well away from 0 (it must come off)
        kw["norm_bias"] = torch.randn(K, device=device, dtype=dtype)
        x += 3
    if "res" in fuse:
        kw["residual"] = torch.randn(1, K, device=device, dtype=dtype)
    if "bias" in fuse:
        kw["bias"] = torch.randn(w.shape[0], device=device, dtype=dtype)
    if "gelu" in fuse:
        kw["gelu"] = True
    if "add" in fuse:
        kw["add"] = torch.randn(1, w.shape[0], device=device, dtype=dtype)
    return x, w, scale, kw


FORMS = {"ffma": {"WARPS": 8, "ROWS": 2, "UNROLL": 4, "BLOCKS": 0}, "mma": {"MMA": 1, "WARPS": 4, "UNROLL": 2}, "bulk": {"BULK": 1}, "bulk_mma": {"BULK": 1, "MMA": 1}}


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(41, 112), (333, 1040), (1000, 4096)])
@pytest.mark.parametrize("quant", ["none", "int8-weight-only", "fp8-weight-only"], ids=["dense", "int8", "fp8"])
@pytest.mark.parametrize("fuse", ["plain", "norm", "norm_res", "norm_res_glu", "glu_bias", "ln", "ln_res_gelu_bias",
                                  "gelu", "add_bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("form", list(FORMS))
def test_cuda_gemv_matches_the_unfused_path(device, N, K, quant, fuse, dtype, form):
    from shardline.kernels import cuda_gemv
    if device == "cpu" or not cuda_gemv.available():
        pytest.skip("the CUDA C GEMV needs a GPU and CuPy")
    x, w, scale, kw = _fused_case(device, N, K, quant, fuse, dtype)
    assert cuda_gemv.fits(x, w, scale, kw.get("bias"))
    config = {"backend": "cuda"} | FORMS[form]
    y, r = fused_linear(x, w, scale, config=config, **kw)
    y_ref, r_ref = fused_linear_ref(x, w, scale, **kw)
    assert_close(y, y_ref, f"cuda gemv {fuse}", tol=2e-2 if quant != "none" else None)
    if "res" in fuse:
        assert torch.equal(r, r_ref), "the new residual x + residual is not exact"


@pytest.mark.gpu
@pytest.mark.parametrize("warps,rows,unroll,blocks,pipe", [(4, 1, 1, 0, 0), (8, 2, 4, 1, 0), (16, 3, 16, 0, 0),
                                                          (2, 2, 2, 1, 0), (8, 2, 4, 0, 1), (4, 3, 5, 1, 1)])
def test_cuda_gemv_tiles(device, warps, rows, unroll, blocks, pipe):
    from shardline.kernels import cuda_gemv
    if device == "cpu" or not cuda_gemv.available():
        pytest.skip("the CUDA C GEMV needs a GPU and CuPy")
    x, w, _, kw = _fused_case(device, 301, 1032, "none", "norm_res_glu", torch.bfloat16)
    cfg = dict(backend="cuda", WARPS=warps, ROWS=rows, UNROLL=unroll, BLOCKS=blocks, PIPE=pipe)
    y, _ = fused_linear(x, w, config=cfg, **kw)
    assert_close(y, fused_linear_ref(x, w, **kw)[0], f"cuda gemv tiles {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("warps,unroll,pipe", [(1, 1, 0), (4, 3, 0), (16, 2, 0), (32, 4, 0), (4, 3, 1), (2, 2, 1)])
@pytest.mark.parametrize("quant", ["none", "int8-weight-only"], ids=["dense", "int8"])
def test_cuda_gemv_mma_tiles(device, warps, unroll, pipe, quant):
    """The tensor-core form with K split over 1 to 32 warps, some of them with no step of K at all
    (K = 1040: 17 steps of 64 int8, 33 of 32 bf16), and N not a multiple of 16 or 8."""
    from shardline.kernels import cuda_gemv
    if device == "cpu" or not cuda_gemv.available():
        pytest.skip("the CUDA C GEMV needs a GPU and CuPy")
    cfg = dict(backend="cuda", MMA=1, WARPS=warps, UNROLL=unroll, PIPE=pipe)
    for fuse in ("plain", "norm_res_glu", "ln_res_gelu_bias"):
        x, w, scale, kw = _fused_case(device, 301, 1040, quant, fuse, torch.bfloat16)
        y, r = fused_linear(x, w, scale, config=cfg, **kw)
        y_ref, r_ref = fused_linear_ref(x, w, scale, **kw)
        assert_close(y, y_ref, f"mma gemv {fuse} {cfg}", tol=2e-2 if quant != "none" else None)
        assert r is None or torch.equal(r, r_ref)


def test_cuda_gemv_operand_rules():
    from shardline.kernels.cuda_gemv import MAX_K, operands_fit
    x = torch.randn(1, 32, dtype=torch.bfloat16)
    w = torch.randn(8, 32, dtype=torch.bfloat16)
    w_q, scale = WEIGHT_ONLY["int8-weight-only"][1](w)
    assert operands_fit(x, w, None, None) and operands_fit(x, w_q, scale, None)
    assert not operands_fit(torch.randn(2, 32, dtype=torch.bfloat16), w, None, None), "one row only"
    assert not operands_fit(x[:, :24], w_q[:, :24].contiguous(), scale, None), "24 int8 is not whole 16-byte chunks"
    assert not operands_fit(x, w_q, scale.float(), None), "the scale must be in x's dtype"
    assert not operands_fit(x, w_q, None, None), "1-byte weights need their scale"
    assert not operands_fit(x, w.half(), None, None), "a 16-bit weight must be in x's dtype"
    assert not operands_fit(x, w.t().contiguous().t(), None, None), "rows must be contiguous"
    wide = torch.zeros(1, MAX_K + 16, dtype=torch.bfloat16)
    assert not operands_fit(wide, torch.zeros(2, MAX_K + 16, dtype=torch.bfloat16), None, None), "x must fit shared memory"


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,block_k,stages", [(4, 128, 1), (8, 1024, 3), (32, 64, 2)])
def test_gemv_tile_configs(device, block_n, block_k, stages):
    from shardline.kernels.triton_gemv import fused_linear_triton
    if not _dispatch.use_triton(torch.empty(0, device=device)):
        pytest.skip("the Triton kernel itself is under test")
    x = torch.randn(1, 520, device=device, dtype=torch.float16)
    w = torch.randn(300, 520, device=device, dtype=torch.float16) * 0.05
    nw = torch.rand(520, device=device, dtype=torch.float16) + 0.5
    y, _ = fused_linear_triton(x, w, None, None, nw, None, 1e-6, True,
                               dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=stages))
    assert_close(y, fused_linear_ref(x, w, norm_weight=nw, glu=True)[0], "gemv config")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shape", ["llama-small", "gptj-small", "gpt2-small"])
@pytest.mark.parametrize("quant", ["none", "int8-weight-only"], ids=["dense", "int8"])
def test_decode_layers_fused_equal_unfused(device, shape, quant, monkeypatch):
    """A stage's decode step through the fused GEMVs (norms, the activation, and GPT-J's parallel
    residual add folded in, residual carried by the kernels) gives the logits of the unfused
    kernels: Llama (RMSNorm, SwiGLU), GPT-J (LayerNorm, GELU, parallel residual, biases) and GPT-2
    (LayerNorm, GELU, biases everywhere). On the CPU `_decode` runs its products unfused (the GEMV
    is CUDA): the layer's composition is what is checked there."""
    from shardline.config import ModelConfig
    from shardline.gemm_tuning import GemmTable, key
    from shardline.kernels import gemv
    from shardline.model.layers import Linear
    from shardline.model.random_weights import SHAPES, random_manifest, random_stage_weights
    from shardline.model.transformer import DecoderLayer, StageModel, StepMetadata
    from shardline.parallel import single_rank

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the fused GEMVs need a CUDA GPU; the CPU case checks the layers' composition")
    cfg = ModelConfig(**SHAPES[shape])
    dtype = torch.float16 if device == "cuda" else torch.float32
    manifest = random_manifest(cfg, "fp16" if device == "cuda" else "fp32", quantization=quant)
    weights = random_stage_weights(manifest, 0, 0, device)
    gen = torch.Generator(device=device).manual_seed(1)
    for name, t in weights.items():  # norms away from 1, so that a norm weight applied twice or not at all shows
        if "norm" in name and name.endswith(".weight"):
            weights[name] = torch.rand(t.shape, generator=gen, device=device).to(t.dtype) + 0.5
    model = StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True)
    assert all(layer.fuse_decode for layer in model.layers)
    if device == "cuda":  # the GEMV runs where tune-gemm chose it: here, a table that chooses it for every linear
        table = GemmTable("test", {key(*lin.weight.shape, lin.weight.dtype, dtype): {4: {"impl": "gemv", "config": None}}
                                   for lin in model.linears()})
        model.configure_gemms(table)
    else:  # the GEMV's choice at one row; and no folded norms (the CPU would take them at any row count)
        monkeypatch.setattr(Linear, "_runs_gemv", lambda self, x, choice: x.shape[0] == 1)
        monkeypatch.setattr(DecoderLayer, "folds", lambda self, h: False)
    block, nkv, hd = 16, cfg.num_kv_heads, cfg.head_dim
    caches = [(torch.zeros(8, block, nkv, hd, dtype=dtype, device=device),
               torch.zeros(8, block, nkv, hd, dtype=dtype, device=device)) for _ in model.layers]
    i32 = dict(dtype=torch.int32, device=device)
    # Prefill 2 sequences of 20 tokens (blocks 0-1 and 2-3).
    ids = torch.randint(0, cfg.vocab_size, (40,), device=device)
    pos = torch.cat([torch.arange(20), torch.arange(20)]).to(device)
    slots = torch.cat([torch.arange(20), 32 + torch.arange(20)]).to(device)
    tables = torch.tensor([[0, 1], [2, 3]], **i32)
    prefill = StepMetadata(pos, slots, tables, torch.tensor([20, 20], **i32), torch.tensor([0, 20, 40], **i32),
                           torch.tensor([19, 39], device=device), max_query_len=20, max_seq_len=20)
    model.forward(ids, prefill, caches)
    # Decode the first sequence's next token: one row, what the GEMV takes.
    step = StepMetadata(torch.tensor([20], device=device), torch.tensor([20], device=device), tables[:1],
                        torch.tensor([21], **i32), torch.tensor([0, 1], **i32),
                        torch.tensor([0], device=device), max_query_len=1, max_seq_len=21)
    new_ids = torch.randint(0, cfg.vocab_size, (1,), device=device)
    fused_layers = []
    decode = DecoderLayer._decode
    monkeypatch.setattr(DecoderLayer, "_decode", lambda self, *a: fused_layers.append(self) or decode(self, *a))
    fused = model.forward(new_ids, step, caches)
    assert len(fused_layers) == cfg.num_layers, "the decode step did not take the fused path"
    monkeypatch.undo()
    monkeypatch.setattr(gemv, "GEMV_MAX_M", 0)  # every linear takes the unfused path
    unfused = model.forward(new_ids, step, caches)
    tol = 2e-2 if quant != "none" else 2e-3 if device == "cuda" else 1e-5
    assert_close(fused, unfused, "fused decode logits", tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("warps,rows,stages,blocks", [(1, 1, 2, 1), (4, 3, 3, 1), (8, 0, 0, 2), (16, 5, 2, 1),
                                                      (8, 1, 8, 3)])
@pytest.mark.parametrize("quant", ["none", "int8-weight-only"], ids=["dense", "int8"])
@pytest.mark.parametrize("mma", [0, 1], ids=["ffma", "mma"])
def test_cuda_gemv_bulk_tiles(device, warps, rows, stages, blocks, quant, mma):
    """The bulk-copy form with 1 to 16 consumer warps (K = 1040: 130 chunks of bf16, 65 of int8,
    so some warps own none: LayerNorm's variance must skip their chunks), groups that do not divide
    N, a ring of 2 to 8 stages that wraps many times, and more blocks than groups (3 a
    multiprocessor, one row each). With MMA, 1 to 10 rows
    a stage: 8, 4 or 2 segments of K (the last one shorter), A rows past the stage's left zero."""
    from shardline.kernels import cuda_gemv
    if device == "cpu" or not cuda_gemv.available():
        pytest.skip("the CUDA C GEMV needs a GPU and CuPy")
    cfg = dict(backend="cuda", BULK=1, MMA=mma, WARPS=warps, ROWS=rows, STAGES=stages, BLOCKS=blocks)
    for fuse in ("plain", "norm_res_glu", "glu_bias", "ln_res_gelu_bias", "add_bias"):
        x, w, scale, kw = _fused_case(device, 301, 1040, quant, fuse, torch.bfloat16)
        y, r = fused_linear(x, w, scale, config=cfg, **kw)
        y_ref, r_ref = fused_linear_ref(x, w, scale, **kw)
        assert_close(y, y_ref, f"bulk gemv {fuse} {cfg}", tol=2e-2 if quant != "none" else None)
        assert r is None or torch.equal(r, r_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["ffma", "bulk", "bulk_mma"])
def test_cuda_gemv_with_programmatic_dependent_launch(device, monkeypatch, form):
    from shardline.kernels import cuda_gemv
    if device == "cpu" or not cuda_gemv.available() or not _dispatch.use_pdl(torch.empty(0, device=device)):
        pytest.skip("PDL needs a Hopper GPU and CuPy")
    monkeypatch.setattr(_dispatch, "GEMV_PDL_ENABLED", True)
    x, w, scale, kw = _fused_case(device, 515, 2064, "int8-weight-only", "norm_res_glu", torch.bfloat16)
    config = {"backend": "cuda"} | FORMS[form]
    y, r = fused_linear(x, w, scale, config=config, **kw)
    y2, _ = fused_linear(y, w[:, :y.shape[1]].contiguous(), scale, config=config)  # waits on the first
    y_ref, r_ref = fused_linear_ref(x, w, scale, **kw)
    assert_close(y, y_ref, "cuda gemv with PDL", tol=2e-2)
    assert_close(y2, fused_linear_ref(y_ref, w[:, :y.shape[1]].contiguous(), scale)[0], "the dependent GEMV", tol=2e-2)
    assert torch.equal(r, r_ref)


def test_the_layernorm_switch_leaves_gptj_unfused_and_llama_fused(monkeypatch):
    """SHARDLINE_GEMV_LAYERNORM=0 (an A/B switch, read at import) keeps GPT-J's and GPT-2's batch-1
    layers and head on their separate norm, activation and add kernels; Llama's are fused either way."""
    from shardline.config import ModelConfig
    from shardline.model.random_weights import SHAPES, random_manifest, random_stage_weights
    from shardline.model.transformer import StageModel, _gemv_norm
    from shardline.parallel import single_rank

    def layers_fused(shape):
        cfg = ModelConfig(**SHAPES[shape])
        weights = random_stage_weights(random_manifest(cfg, "fp32"), 0, 0, "cpu")
        model = StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True)
        return [layer.fuse_decode for layer in model.layers] + [_gemv_norm(model.norm)]

    assert all(layers_fused("gptj-small")) and all(layers_fused("gpt2-small"))
    monkeypatch.setattr(_dispatch, "GEMV_LAYERNORM", False)
    assert not any(layers_fused("gptj-small")) and not any(layers_fused("gpt2-small"))
    assert all(layers_fused("llama-small"))
