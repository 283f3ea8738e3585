"""`shardline tune-gemm`'s table: the engine must pick the tuned choice for the right batch size
and fall back cleanly when the file is missing or from another GPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from shardline.gemm_tuning import GemmTable, key, linear_shapes, tune
from shardline.config import ConfigError, ModelConfig
from shardline.model.random_weights import LLAMA3_8B


def table() -> GemmTable:
    t = GemmTable("cpu")
    k = key(4096, 4096, torch.bfloat16, torch.bfloat16)
    t.entries[k] = {1: {"impl": "triton", "config": {"BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8}},
                    64: {"impl": "cublas", "config": None}}
    return t


def test_choice_uses_the_smallest_tuned_batch_at_or_above_m():
    t = table()
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 1)["impl"] == "triton"
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 16)["impl"] == "cublas"
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 65) is None, "above the largest: default path"
    assert t.choice(4096, 1024, torch.bfloat16, torch.bfloat16, 1) is None, "untuned shape: default path"


def test_a_table_without_batch_1_leaves_batch_1_to_the_gemv():
    """Buckets never carry a batch-64 choice down to one row: that row is the GEMV's regime, and a
    table tuned only above it (the H200 decode table) must not send batch 1 to cuBLAS."""
    t = table()
    del t.entries[key(4096, 4096, torch.bfloat16, torch.bfloat16)][1]
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 1) is None
    assert t.choice(4096, 4096, torch.bfloat16, torch.bfloat16, 2)["impl"] == "cublas"


def test_round_trip_and_fallbacks(tmp_path, caplog):
    path = tmp_path / "gemm.json"
    table().save(path)
    loaded = GemmTable.load(path, torch.device("cpu"))
    assert loaded is not None and loaded.entries == table().entries
    other = GemmTable("NVIDIA H100 80GB HBM3", table().entries)
    other.save(path)
    with caplog.at_level(logging.WARNING):
        assert GemmTable.load(path, torch.device("cpu")) is None
        assert GemmTable.load(tmp_path / "missing.json", torch.device("cpu")) is None
    assert "tuned on" in caplog.text and "not found" in caplog.text


BAD_ENTRIES = [
    ({"impl": "cutlass", "config": None}, "impl 'cutlass' unknown; one of cublas, triton, ring"),
    ({"impl": "triton", "config": {"BLOKC_N": 64, "BLOCK_K": 128}}, "split-K config keys ['BLOKC_N'] unknown"),
    ({"impl": "triton", "config": {"BLOCK_N": 100, "BLOCK_K": 128}}, "BLOCK_N=100: weight rows a tile, one of 16"),
    ({"impl": "triton", "config": {"SPLIT_K": 8}}, "lacks BLOCK_N, BLOCK_K"),
    ({"impl": "triton", "config": {"BLOCK_N": 64, "BLOCK_K": 128, "LATE": "yes"}}, "LATE='yes': 0 or 1"),
    ({"impl": "triton", "config": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 3}}, "num_warps=3: one of 1, 2, 4"),
    ({"impl": "triton", "config": {"BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 0}}, "SPLIT_K=0: the K splits"),
    ({"impl": "ring", "config": {"BLOCK_N": 64, "STAGE": 4}}, "ring GEMM config keys ['STAGE'] unknown"),
    ({"impl": "streamk", "config": {"BLOCK_N": 64, "SPLITS": 2}}, "stream-K config keys ['SPLITS'] unknown"),
    ({"impl": "triton", "config": [64, 128]}, "config [64, 128] is not an object of keys"),
]


@pytest.mark.parametrize("entry,names", BAD_ENTRIES, ids=[n.split(":")[0][:24] for _, n in BAD_ENTRIES])
def test_a_table_entry_no_kernel_takes_fails_at_load_naming_it(tmp_path, entry, names):
    """A hand-edited or stale table fails when the engine loads it, with the file, the entry and
    the fix, not with Triton's compile error (or a KeyError) at the first step that runs it."""
    t = table()
    t.entries[key(4096, 14336, torch.bfloat16, torch.bfloat16)] = {16: entry}
    path = tmp_path / "gemm.json"
    t.save(path)
    with pytest.raises(ConfigError) as e:
        GemmTable.load(path, torch.device("cpu"))
    message = str(e.value)
    assert str(path) in message and "entry 4096x14336:bfloat16:bfloat16 at 16 rows" in message, message
    assert names in message and "re-run `shardline tune-gemm`" in message, message


def test_a_file_that_is_no_table_fails_at_load_naming_it(tmp_path):
    for text in ("{not json", '{"gpu": "cpu"}', '{"gpu": "cpu", "entries": {"4096x4096:bfloat16:bfloat16": {"x": {}}}}'):
        path = tmp_path / "gemm.json"
        path.write_text(text)
        with pytest.raises(ConfigError, match="is not a `shardline tune-gemm` table"):
            GemmTable.load(path, torch.device("cpu"))


def test_every_candidate_tune_gemm_writes_passes_the_checks():
    """The checks a table gets at load hold for whatever `tune-gemm` itself may write."""
    pytest.importorskip("triton", reason="the stream-K kernel's default tile comes from its Triton module")
    from shardline.gemm_tuning import RING_CONFIGS, STREAMK_KEYS, TRITON_CONFIGS, TRITON_CONFIGS_WIDE
    from shardline.kernels.quant import ring_config, split_k_config
    from shardline.kernels.triton_streamk import default_config
    for c in TRITON_CONFIGS + TRITON_CONFIGS_WIDE:
        for twin in (c, dict(c, TMA=1), dict(c, TMA=1, LATE=1)):
            split_k_config(twin)
    for c in RING_CONFIGS:
        ring_config(dict(c, LATE=1))
    for m in (16, 32, 64):
        assert set(dict(default_config(m, False), TMA=1)) <= set(STREAMK_KEYS)


@pytest.mark.parametrize("name", ["gemm-h200-decode.json", "gemm-h100-decode.json"])
def test_the_committed_tables_pass_the_kernels_checks(name):
    """The tables the README and the benchmarks point the engine at load without a problem."""
    path = Path(__file__).parent.parent / "benchmarks" / "results" / name
    assert GemmTable.read(path).problems() == []


def test_linear_shapes_follow_the_tp_split():
    cfg = ModelConfig(**LLAMA3_8B)
    assert linear_shapes(cfg, 1)["qkv_proj"] == (6144, 4096)
    assert linear_shapes(cfg, 2) == {"qkv_proj": (3072, 4096), "o_proj": (4096, 2048), "up_proj": (14336, 4096),
                                     "down_proj": (4096, 7168), "lm_head": (64128, 4096)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="tuning times kernels on a CUDA GPU")
def test_tune_picks_a_candidate_no_slower_than_cublas():
    t, report = tune({"o_proj": (1024, 1024)}, [1, 16], torch.bfloat16, "none", torch.device("cuda"))
    assert all(r["best_us"] <= r["default_us"] for r in report)
    assert t.choice(1024, 1024, torch.bfloat16, torch.bfloat16, 1) is not None


def test_one_row_runs_the_gemv_by_default_and_a_table_overrides_it(monkeypatch):
    from shardline.kernels import cuda_gemv, gemv
    from shardline.model.layers import Linear
    monkeypatch.setattr(gemv, "fits", lambda x, w: x.shape[0] == 1)  # as on a GPU with Triton ...
    monkeypatch.setattr(cuda_gemv, "fits", lambda x, w, scale, bias: True)  # ... and CuPy
    lin = Linear(torch.zeros(4096, 4096, dtype=torch.bfloat16))
    one, two = torch.zeros(1, 4096, dtype=torch.bfloat16), torch.zeros(2, 4096, dtype=torch.bfloat16)
    assert lin.uses_gemv(one) and not lin.uses_gemv(two)
    lin.gemms = table()
    assert not lin.uses_gemv(one), "the table chose the split-K kernel at M = 1"
    lin.gemms.entries[key(4096, 4096, torch.bfloat16, torch.bfloat16)][1] = {"impl": "gemv", "config": {"backend": "cuda"}}
    assert lin.uses_gemv(one)
    lin.gemms = None
    monkeypatch.setattr(cuda_gemv, "fits", lambda x, w, scale, bias: False)
    assert not lin.uses_gemv(one), "without the CUDA kernel (no CuPy) the default is cuBLAS"


def test_a_candidate_must_agree_with_the_reference_to_be_timed():
    from shardline.gemm_tuning import agrees
    ref = torch.randn(4, 300)
    assert agrees(ref + 1e-3 * ref.abs().max() * torch.randn_like(ref).clamp(-1, 1), ref)
    wrong = ref.clone()
    wrong[2, 17] += 0.1 * ref.abs().max()
    assert not agrees(wrong, ref), "one wrong element is enough"
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not agrees(nan, ref)
    assert not agrees(ref[:, :299], ref), "a wrong shape"


def test_a_streamk_choice_runs_the_streamk_op(monkeypatch):
    """A table entry {"impl": "streamk"} sends the product through quant.streamk_linear (its
    reference on the CPU), with the entry's tiles, and computes the plain linear."""
    from shardline.kernels import quant
    from shardline.model.layers import Linear
    w, bias = torch.randn(96, 64), torch.randn(96)
    lin = Linear(w, bias)
    lin.gemms = GemmTable("test GPU", {key(96, 64, torch.float32, torch.float32): {
        16: {"impl": "streamk", "config": {"BLOCK_N": 64}}}})
    seen = []
    real = quant.streamk_linear
    monkeypatch.setattr(quant, "streamk_linear", lambda *a, **kw: seen.append(kw["config"]) or real(*a, **kw))
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, bias))
    assert seen == [{"BLOCK_N": 64}]


def test_a_ring_choice_runs_the_ring_op_with_swiglu_and_fp32_logits(monkeypatch):
    """A table entry {"impl": "ring"} sends the product through quant.ring_linear (its reference on
    the CPU) with the entry's tiles: SwiGLU in its epilogue for `glu`, the logits' dtype passed in."""
    from shardline.kernels import activation, quant
    from shardline.model.layers import Linear
    w, bias = torch.randn(192, 64), torch.randn(192)
    lin = Linear(w, bias)
    lin.gemms = GemmTable("test GPU", {key(192, 64, torch.float32, torch.float32): {
        16: {"impl": "ring", "config": {"BLOCK_N": 64, "SPLIT_K": 2}}}})
    seen = []
    real = quant.ring_linear
    monkeypatch.setattr(quant, "ring_linear", lambda *a, **kw: seen.append((a[3], kw)) or real(*a, **kw))
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin.glu(x), activation.silu_and_mul_ref(torch.nn.functional.linear(x, w, bias)))
    logits = lin(x, out_dtype=torch.float64)
    torch.testing.assert_close(logits, torch.nn.functional.linear(x, w, bias).double())
    config = {"BLOCK_N": 64, "SPLIT_K": 2}
    assert seen == [(config, {"glu": True, "out_dtype": None}), (config, {"glu": False, "out_dtype": torch.float64})]


def test_glu_takes_the_tables_triton_choice_with_swiglu_in_its_epilogue(monkeypatch):
    """Linear.glu (the MLP's gate/up at batch > 1) runs the table's split-K choice with glu=True,
    and computes silu(gate) * up of the product; without a table, the product then the activation."""
    from shardline.kernels import activation, quant
    from shardline.model.layers import Linear
    w = torch.randn(192, 64)
    lin = Linear(w)
    x = torch.randn(5, 64)
    want = activation.silu_and_mul_ref(torch.nn.functional.linear(x, w))
    torch.testing.assert_close(lin.glu(x), want)
    lin.gemms = GemmTable("test GPU", {key(192, 64, torch.float32, torch.float32): {
        16: {"impl": "triton", "config": {"BLOCK_N": 64}}}})
    seen = []
    real = quant.small_m_linear
    monkeypatch.setattr(quant, "small_m_linear", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    torch.testing.assert_close(lin.glu(x), want)
    assert seen == [{"glu": True, "out_dtype": None, "gelu": False}]
    logits = lin(x, out_dtype=torch.float64)  # the logits' path: the kernel writes the wider dtype itself
    assert seen[-1] == {"glu": False, "out_dtype": torch.float64, "gelu": False} and logits.dtype == torch.float64
    torch.testing.assert_close(logits, torch.nn.functional.linear(x, w).double())
    # GELU (GPT-J, GPT-2) goes into the same kernel's epilogue; without a table, the activation follows
    gelu = activation.gelu_tanh_ref(torch.nn.functional.linear(x, w))
    torch.testing.assert_close(lin.gelu(x), gelu)
    assert seen[-1] == {"glu": False, "out_dtype": None, "gelu": True}
    lin.gemms = None
    torch.testing.assert_close(lin.gelu(x), gelu)
    assert len(seen) == 3


def test_tma_twins_every_split_k_tile_only_where_asked():
    pytest.importorskip("triton", reason="the candidate list reads the split-K kernel's limits (Triton)")
    from shardline.gemm_tuning import triton_candidates
    plain, both = triton_candidates(64), triton_candidates(64, tma=True)
    assert not any("TMA" in c for c in plain)
    assert both[:len(plain)] == plain and both[len(plain):] == [dict(c, TMA=1) for c in plain]
    assert triton_candidates(128, tma=True) == [], "above 64 rows cuBLAS multiplies"


def test_ahead_twins_reach_past_the_ring_and_keep_the_tile():
    from shardline.gemm_tuning import ahead_candidates
    tile = dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, TMA=1)
    twins = ahead_candidates(tile)
    assert [c.pop("AHEAD") for c in twins] == [4, 6, 8], "the ring holds num_stages - 1 tiles: start one past it"
    assert all(c == tile for c in twins) and "AHEAD" not in tile, "only AHEAD differs; the tile is not modified"


def test_ring_candidates_only_where_the_ring_gemm_runs():
    from shardline.gemm_tuning import RING_CONFIGS, ring_candidates
    x, w = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(96, 128, dtype=torch.bfloat16)
    assert ring_candidates(64, x, w, None) == [], "CPU tensors: there is no ring GEMM to time"
    assert any(c.get("EARLY") == 0 for c in RING_CONFIGS), "the early-weights idea is timed against itself"
    tiled = [c for c in RING_CONFIGS if not c.get("SUB")]
    assert all(c["STAGES"] * (64 + c["BLOCK_N"]) * c["BLOCK_K"] * 2 <= 200 << 10 for c in tiled), \
        "every tiled ring fits a multiprocessor's shared memory (227 KB, less the epilogue's scratch)"
    from shardline.kernels.quant import ring_config, ring_plan

    def fits(c, n, k, glu):
        try:
            return ring_plan(ring_config(c), n, k, glu, 2, 132) is not None
        except ValueError:
            return False
    shapes = linear_shapes(ModelConfig(**LLAMA3_8B))
    balanced = [c for c in RING_CONFIGS if c.get("SUB")]
    assert balanced and all(any(fits(c, n // 2 if name == "up_proj" else n, k, name == "up_proj")
                                for name, (n, k) in shapes.items()) for c in balanced), \
        "every balanced ring fits some Llama-3-8B linear on an H200 (the others skip it with a ValueError)"


def test_the_h200_table_tunes_every_projection_at_the_same_batches():
    """A batch takes the smallest tuned M at or above it, per linear: a projection without a bucket
    the others have runs those rows on a larger bucket's entry (bucket_gaps). The committed table
    had none at 16 rows for gate/up and down, which then ran batch 32's: 5.0 ms a step against 4.5."""
    from shardline.gemm_tuning import bucket_gaps
    table = GemmTable.read(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gemm-h200-decode.json")
    shapes = linear_shapes(ModelConfig(**LLAMA3_8B))
    keys = {name: key(n, k, torch.bfloat16, torch.bfloat16) for name, (n, k) in shapes.items() if name != "lm_head"}
    assert bucket_gaps(table, keys) == {}
    assert {16, 32, 64} <= set(table.entries[key(*shapes["up_proj"], torch.bfloat16, torch.bfloat16)])
    table.entries[key(*shapes["down_proj"], torch.bfloat16, torch.bfloat16)].pop(16)
    assert bucket_gaps(table, keys) == {"down_proj": [16]}


def test_a_model_names_the_projections_a_table_leaves_without_a_bucket():
    """What the stage worker warns about when it loads a table: its own projections' keys (the
    weights' dtype, the model's), checked with bucket_gaps."""
    from shardline.model.random_weights import LLAMA_SMALL, random_manifest, random_stage_weights
    from shardline.model.transformer import StageModel
    from shardline.parallel import single_rank
    cfg = ModelConfig(**LLAMA_SMALL)
    weights = random_stage_weights(random_manifest(cfg, "fp32"), 0, 0, "cpu", seed=3)
    model = StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True)
    layer, f32 = model.layers[0], torch.float32
    entry = {"impl": "cublas", "config": None}
    table = GemmTable("cpu", {key(*lin.weight.shape, f32, f32): {16: entry, 64: entry}
                              for lin in (layer.qkv_proj, layer.o_proj, layer.up_proj, layer.down_proj)})
    assert model.gemm_bucket_gaps(table) == {}
    table.entries[key(*layer.o_proj.weight.shape, f32, f32)].pop(16)
    table.entries[key(*layer.o_proj.weight.shape, f32, f32)][1] = entry  # one row never counts
    assert model.gemm_bucket_gaps(table) == {"o_proj": [16]}
