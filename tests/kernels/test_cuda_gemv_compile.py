"""The CUDA C GEMV's source compiles for sm_90 in every variant the engine can ask for, on a machine
without a GPU (NVRTC only); its numerics are checked on the GPU in test_gemv.py."""

from __future__ import annotations

import itertools
import re

import pytest

from shardline.kernels import cuda_gemv, cuda_runtime

try:
    cuda_runtime._nvrtc()
    NVRTC = True
except ImportError:
    NVRTC = False

needs_nvrtc = pytest.mark.skipif(not NVRTC, reason="NVRTC missing (scripts/setup.sh installs nvidia-cuda-nvrtc-cu12)")

WEIGHTS = {"bf16": dict(w_bytes=2, fp8=False, scale=False), "int8": dict(w_bytes=1, fp8=False, scale=True),
           "fp8": dict(w_bytes=1, fp8=True, scale=True)}
FUSIONS = {"plain": dict(norm=False, res=False, glu=False), "norm_res": dict(norm=True, res=True, glu=False),
           "norm_res_glu": dict(norm=True, res=True, glu=True), "glu": dict(norm=False, res=False, glu=True),
           "ln_res_gelu": dict(norm=True, ln=True, res=True, glu=False, gelu=True),
           "add": dict(norm=False, res=False, glu=False, add=True)}


def _ptx(weights: str, fusion: str, *, x_fp16=False, bias=False, pdl=False, tiles=None) -> str:
    glu = FUSIONS[fusion]["glu"]
    tiles = tiles or (cuda_gemv.FFMA_GLU_CONFIG if glu else cuda_gemv.FFMA_CONFIG)
    return cuda_gemv.compile_ptx(cuda_gemv.defines(x_fp16=x_fp16, bias=bias, pdl=pdl, **WEIGHTS[weights],
                                                   **FUSIONS[fusion], **tiles))


@needs_nvrtc
@pytest.mark.parametrize("weights,fusion", list(itertools.product(WEIGHTS, FUSIONS)))
def test_every_variant_compiles_and_streams_past_l1(weights, fusion):
    ptx = _ptx(weights, fusion, x_fp16=weights == "int8", bias=fusion == "glu")
    assert ".entry gemv" in ptx
    assert "ld.global.nc.L1::no_allocate" in ptx, "the weights must bypass L1"
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) == (weights == "fp8")
    assert "griddepcontrol" not in ptx, "PDL is off unless asked for"


@needs_nvrtc
@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("form", ["ffma", "mma"])
def test_the_rolling_pipeline_compiles(weights, form):
    tiles = dict(WARPS=8, ROWS=2, UNROLL=4, BLOCKS=0) | ({"MMA": 1} if form == "mma" else {})
    batched = _ptx(weights, "norm_res_glu", tiles=dict(tiles, PIPE=0))
    rolling = _ptx(weights, "norm_res_glu", tiles=dict(tiles, PIPE=1))
    op = "mma.sync" if form == "mma" else "fma.rn.f32"
    assert _longest_run(rolling, op) * 2 < _longest_run(batched, op), \
        "the rolling pipeline refills each chunk's registers right after using them, between the products"


def _longest_run(ptx: str, op: str) -> int:
    """The most `op` instructions in a row with no weight load between them."""
    best = run = 0
    for line in ptx.splitlines():
        if op in line:
            run += 1
            best = max(best, run)
        elif "ld.global.nc.L1::no_allocate" in line:
            run = 0
    return best


@needs_nvrtc
@pytest.mark.parametrize("weights,fusion", list(itertools.product(WEIGHTS, FUSIONS)))
def test_the_tensor_core_form_compiles(weights, fusion):
    ptx = _ptx(weights, fusion, x_fp16=weights == "fp8", tiles=dict(WARPS=8, UNROLL=4, MMA=1))
    kind = "bf16.bf16" if weights == "bf16" else "f16.f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.f32" in ptx
    assert "ld.global.nc.L1::no_allocate" in ptx


@needs_nvrtc
@pytest.mark.parametrize("weights,fusion", list(itertools.product(WEIGHTS, FUSIONS)))
@pytest.mark.parametrize("mma", [0, 1], ids=["ffma", "mma"])
def test_the_bulk_copy_form_compiles(weights, fusion, mma):
    glu = FUSIONS[fusion]["glu"]
    tiles = cuda_gemv.bulk_tiles(4096, WEIGHTS[weights]["w_bytes"], glu, dict(cuda_gemv.BULK_CONFIG, MMA=mma))
    ptx = _ptx(weights, fusion, tiles=tiles)
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "L2::evict_first" in ptx, "the weights are read once: first out of L2"
    assert "ld.shared.v4" in ptx and "ld.global.nc.L1::no_allocate" not in ptx
    assert ("mma.sync.aligned.m16n8k16" in ptx) == bool(mma)


@needs_nvrtc
def test_bulk_pdl_variant_streams_before_the_wait():
    tiles = cuda_gemv.bulk_tiles(4096, 2, False, cuda_gemv.BULK_CONFIG)
    ptx = _ptx("bf16", "plain", pdl=True, tiles=tiles)
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("cp.async.bulk") < wait, "the first stages stream before the wait"
    x_loads = [m.start() for m in re.finditer(r"ld\.global\.nc\.v4", ptx)]
    assert x_loads and min(x_loads) > wait, "x is read only after the kernel before has finished"
    ptx = _ptx("bf16", "norm_res", pdl=True, tiles=tiles)  # the norm weight, a constant, is read before
    wait = ptx.index("griddepcontrol.wait")
    loads = [m.start() for m in re.finditer(r"ld\.global\.nc\.v4", ptx)]
    assert min(loads) < wait < max(loads)


def test_bulk_pre_stages_stream_before_the_wait_and_the_rest_after():
    tiles = cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, PRE=1))
    assert (tiles["STAGES"], tiles["PRE"]) == (3, 1)
    assert cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, PRE=9))["PRE"] == 3
    ptx = _ptx("bf16", "plain", pdl=True, tiles=tiles)
    wait, copies = ptx.index("griddepcontrol.wait"), [m.start() for m in re.finditer(r"cp\.async\.bulk", ptx)]
    assert min(copies) < wait < max(copies)
    assert cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, PRE=0))["PRE"] == 3  # the whole ring
    with pytest.raises(ValueError, match="PRE=-1"):
        cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, PRE=-1))


def test_trace_of_names_the_missing_knob():
    import torch
    x, w = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="add TRACE=1"):
        cuda_gemv.trace_of(x, w, None, None, None, None, False, {"backend": "cuda", "BULK": 1})


def test_bulk_tiles_fit_the_ring():
    # 32 KB stages in a 96 KB ring by default
    t = cuda_gemv.bulk_tiles(4096, 2, False, cuda_gemv.BULK_CONFIG)  # 8 KB rows
    assert (t["ROWS"], t["STAGES"], t["CPL"], t["BLOCKS"]) == (4, 3, 2, 2)
    t = cuda_gemv.bulk_tiles(14336, 2, False, cuda_gemv.BULK_CONFIG)  # 28 KB rows: one a stage
    assert (t["ROWS"], t["STAGES"], t["CPL"]) == (1, 3, 7)
    t = cuda_gemv.bulk_tiles(4096, 1, True, cuda_gemv.BULK_CONFIG)  # int8 gate + up: 8 KB a row pair
    assert (t["ROWS"], t["STAGES"], t["CPL"]) == (4, 3, 1)
    t = cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, STAGE_KB=16, RING_KB=64))
    assert (t["ROWS"], t["STAGES"]) == (2, 4)
    t = cuda_gemv.bulk_tiles(112, 2, False, cuda_gemv.BULK_CONFIG)  # short rows: at most 8 a stage
    assert t["ROWS"] == cuda_gemv.BULK_MAX_ROWS
    with pytest.raises(ValueError, match="fewer ROWS or STAGES"):
        cuda_gemv.bulk_tiles(14336, 2, True, dict(cuda_gemv.BULK_CONFIG, ROWS=2, STAGES=4))
    with pytest.raises(ValueError, match="fewer ROWS or STAGES"):
        cuda_gemv.bulk_tiles(4096, 2, False, dict(cuda_gemv.BULK_CONFIG, ROWS=9))
    mma = dict(cuda_gemv.BULK_CONFIG, MMA=1)  # the stage's rows x 16 / rows segments of K: the A operand
    t = cuda_gemv.bulk_tiles(4096, 1, False, dict(mma, ROWS=2))  # 8 segments of 32 int8 chunks: 8 steps of 4
    assert (t["ROWS"], t["CPL"]) == (2, 1)
    t = cuda_gemv.bulk_tiles(4096, 1, False, mma)  # 32 KB: 8 rows, 2 segments of 128 chunks: 32 steps
    assert (t["ROWS"], t["CPL"]) == (8, 4)
    t = cuda_gemv.bulk_tiles(4096, 2, True, dict(mma, ROWS=3))  # 6 rows -> 8 A rows: 2 segments of 256
    assert t["CPL"] == 8
    assert cuda_gemv.bulk_tiles(4096, 1, True, dict(mma, ROWS=1))["CPL"] == 1, "2 rows: 8 segments"


@needs_nvrtc
def test_pdl_variant_waits_before_reading_x():
    ptx = _ptx("bf16", "norm_res", pdl=True)
    wait = ptx.index("griddepcontrol.wait")
    first_weight_load = ptx.index("ld.global.nc.L1::no_allocate")
    assert first_weight_load < wait, "the first weights stream before the wait"
    x_loads = [m.start() for m in re.finditer(r"ld\.global\.nc\.v4", ptx)]  # x, residual, norm weight
    assert x_loads and min(x_loads) > wait, "x is read only after the kernel before has finished"


@needs_nvrtc
def test_a_source_error_names_the_compiler_log():
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        cuda_gemv.compile_ptx("#define WARPS 8\n")  # the other tile constants are missing


def test_no_tiles_is_the_bulk_form_and_ffma_tiles_fill_in():
    assert cuda_gemv.resolve_tiles(None, 4096, 2, False) == cuda_gemv.bulk_tiles(4096, 2, False, cuda_gemv.BULK_CONFIG)
    assert cuda_gemv.resolve_tiles({"backend": "cuda", "BULK": 1, "WARPS": 4}, 4096, 2, False)["CPL"] == 4
    assert cuda_gemv.resolve_tiles({"backend": "cuda", "UNROLL": 8}, 4096, 2, True) == dict(cuda_gemv.FFMA_GLU_CONFIG,
                                                                                           UNROLL=8)


def test_a_shape_the_bulk_ring_cannot_hold_takes_the_ffma_form_unless_bulk_was_asked_for():
    # gate/up rows of 50 K bf16 columns: 200 KB a row pair, two stages would need 400 KB
    tiles, (_, _, shared) = cuda_gemv.launch_plan(None, 1024, cuda_gemv.MAX_K, 2, True, True, 132, False, False)
    assert tiles == cuda_gemv.FFMA_GLU_CONFIG and shared == 4 * cuda_gemv.MAX_K
    tiles, _ = cuda_gemv.launch_plan(None, 4096, 4096, 2, False, True, 132, False, False)
    assert tiles["BULK"], "a shape that fits keeps the bulk form"
    with pytest.raises(ValueError, match="fewer ROWS or STAGES"):
        cuda_gemv.launch_plan({"BULK": 1}, 1024, cuda_gemv.MAX_K, 2, True, True, 132, False, False)


def test_before_hopper_the_default_is_the_ffma_form_and_bulk_is_refused():
    assert cuda_gemv.resolve_tiles(None, 4096, 2, False, hopper=False) == cuda_gemv.FFMA_CONFIG
    assert cuda_gemv.resolve_tiles({"backend": "cuda"}, 4096, 1, True, hopper=False) == cuda_gemv.FFMA_GLU_CONFIG
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        cuda_gemv.resolve_tiles({"BULK": 1}, 4096, 2, False, hopper=False)


def test_launch_geometry():
    ffma = dict(WARPS=8, ROWS=2, UNROLL=4, BLOCKS=0)
    assert cuda_gemv.geometry(4096, 4096, False, 2, ffma, 132) == (256, 256, 4 * 4096)
    assert cuda_gemv.geometry(4097, 4096, False, 2, ffma, 132)[0] == 257, "a partial block for the last rows"
    assert cuda_gemv.geometry(14336, 4096, True, 1, dict(ffma, BLOCKS=2), 132)[0] == 264, "persistent: 2 per SM"
    bulk = dict(BULK=1, WARPS=8, ROWS=2, STAGES=6, BLOCKS=1)  # a producer warp beside 8 consumers
    assert cuda_gemv.geometry(4096, 4096, False, 2, bulk, 132) == (132, 288, 6 * 2 * 8192)
    assert cuda_gemv.geometry(14336, 4096, True, 2, bulk, 132) == (132, 288, 6 * 4 * 8192)
    assert cuda_gemv.geometry(101, 1024, False, 2, bulk, 132)[0] == 51, "no block without a group"
    # int8 gate/up: each block also stages its rows' scales (gate and up), 55 at most
    # (2 bytes for each of 55 groups of 2 rows, gate and up)
    assert cuda_gemv.geometry(14336, 4096, True, 1, bulk, 132, scale=True)[2] == 6 * 4 * 4096 + 2 * 55 * 2 * 2
    mma = dict(WARPS=4, UNROLL=4, MMA=1)
    # 16 rows a block (8 gate/up pairs with GLU); x staged as 2-byte pairs over whole steps of K.
    assert cuda_gemv.geometry(4096, 4096, False, 2, mma, 132) == (256, 128, 2 * 4096)
    assert cuda_gemv.geometry(14336, 4096, True, 1, mma, 132) == (1792, 128, 2 * 4096)
    assert cuda_gemv.geometry(301, 1040, False, 1, mma, 132) == (19, 128, 2 * 1088), "1040 -> 17 steps of 64"
    assert cuda_gemv.geometry(301, 1040, False, 2, mma, 132) == (19, 128, 2 * 1056), "1040 -> 33 steps of 32"


def test_gemv_pdl_is_per_form_unless_the_environment_says(monkeypatch):
    """SHARDLINE_GEMV_PDL unset: the bulk form takes PDL and the FFMA and MMA forms do not; 0 or 1
    sets every form (where PDL can run at all: `use_pdl`)."""
    import torch
    from shardline.kernels import _dispatch
    x = torch.empty(0)
    monkeypatch.setattr(_dispatch, "use_pdl", lambda x: True)
    for setting, bulk, other in ((None, True, False), (False, False, False), (True, True, True)):
        monkeypatch.setattr(_dispatch, "GEMV_PDL_ENABLED", setting)
        assert (_dispatch.use_gemv_pdl(x, True), _dispatch.use_gemv_pdl(x, False)) == (bulk, other)
    monkeypatch.setattr(_dispatch, "use_pdl", lambda x: False)
    monkeypatch.setattr(_dispatch, "GEMV_PDL_ENABLED", True)
    assert not _dispatch.use_gemv_pdl(x, True), "no PDL where the GPU cannot"


@pytest.mark.parametrize("w_bytes", [1, 2])
def test_the_measuring_knobs_compile(w_bytes):
    """DRY=1 reads no stage (no shared-memory loads of weights); TRACE=1 declares the stamps' buffer."""
    tiles = cuda_gemv.bulk_tiles(4096, w_bytes, False, cuda_gemv.BULK_CONFIG)
    flags = dict(x_fp16=False, w_bytes=w_bytes, fp8=False, norm=True, res=True, glu=False, scale=w_bytes == 1,
                 bias=False, pdl=True)
    assert "ld.shared.v4" in cuda_gemv.compile_ptx(cuda_gemv.defines(**flags, **tiles))
    assert "ld.shared.v4" not in cuda_gemv.compile_ptx(cuda_gemv.defines(**flags, **dict(tiles, DRY=1)))
    assert "gemv_trace" in cuda_gemv.compile_ptx(cuda_gemv.defines(**flags, **dict(tiles, TRACE=1)))
