"""The 12-bit weight form (shardline/kernels/exp12.py) and its kernel (gluon_exp12.py): the form
gives back the bf16 weight bit for bit, corrections included; the product's reference on the CPU
is the bf16 weight's; the kernel compiles for sm_90 on any machine with no spills and fits shared
memory; a table's exp12 entry reaches a layer's products and not the head; on a Hopper GPU the kernel
multiplies by exactly the weight packed (its corrections visible), K split or not, the residual
added with its sums of squares."""

from __future__ import annotations

import logging

import pytest
import torch

from shardline.gemm_tuning import GemmTable, key
from shardline.kernels import _dispatch, quant
from shardline.kernels.exp12 import MAX_ENTRIES, TILE_ROWS, exp12_config, exp12_tiles, pack, row_order, unpack
from shardline.kernels.norm import RowNorm


def _weight(n: int, k: int, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + n * k)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[3, 5], w[n - 2, k - 7], w[0, 0] = 0.0, 1e-9, -0.11  # a zero and a tiny one fall below; the largest sets the base
    w[7, 9] = torch.tensor(2.0 ** -130)  # a subnormal
    return w.to(device)


@pytest.mark.parametrize("glu", [True, False])
def test_the_form_gives_back_the_weight_bit_for_bit(glu):
    w = _weight(256, 512)
    packed = pack(w, glu=glu)
    assert packed.shape == (256, 512) and packed.n_plane.shape == (256, 256) and packed.base % 2 == 0
    assert torch.equal(packed.weight().view(torch.int16), w.view(torch.int16))
    listed = int((packed.corr_rows >= 0).sum())
    stored = unpack(packed.b_plane, packed.n_plane, packed.base)
    original_order = w[row_order(256, glu)]
    differs = stored.view(torch.int16) != original_order.view(torch.int16)
    assert listed == int(differs.sum()) >= 4, "exactly the below-window weights are listed"
    assert (stored[differs] == packed.floor).all()
    assert packed.entries in (16, 32, 64) and packed.corr_rows.shape == (256 // TILE_ROWS, packed.entries)


def test_a_stray_outlier_does_not_move_the_window_it_is_listed():
    """bf16 normal_ on a GPU draws a few weights far out in the tails; a window reaching the
    largest would leave ~4x more small weights below it. The window holds the bulk and the
    outlier is corrected like a below-window weight."""
    w = _weight(256, 512)
    bulk = pack(w)
    w[9, 11] = 0.4  # exponent field 125, two above the bulk's top
    packed = pack(w)
    assert packed.base == bulk.base and torch.equal(packed.weight().view(torch.int16), w.view(torch.int16))
    assert int((packed.corr_rows >= 0).sum()) == int((bulk.corr_rows >= 0).sum()) + 1


def test_glu_rows_pair_gate_and_up_in_each_slab():
    order = row_order(256, glu=True)  # N = 128 gate rows
    assert order[:16].tolist() == list(range(8)) + list(range(128, 136))
    assert order[128:144].tolist() == list(range(64, 72)) + list(range(192, 200))
    assert sorted(order.tolist()) == list(range(256))


def test_pack_names_what_it_cannot_take():
    with pytest.raises(ValueError, match="K=96 is not a multiple of 64.*keep it in bf16"):
        pack(torch.zeros(128, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="gate rows are not a multiple of 64"):
        pack(torch.zeros(192, 64, dtype=torch.bfloat16), glu=True)
    w = _weight(128, 256)
    w[:3, :] = 0.0  # more zeros in one tile than its finest K split corrects
    with pytest.raises(ValueError, match="[0-9]+ weights of one 128-row tile lie outside .*keep it in bf16"):
        pack(w)
    w[5, 0] = float("inf")
    with pytest.raises(ValueError, match="inf or NaN"):
        pack(w)


def test_a_k_split_corrects_its_own_columns_share_of_the_list():
    """A tile's list is sorted by column; a config fits where each K split's columns hold at most
    MAX_ENTRIES of it, and one that does not is a ValueError that names the splits that fit."""
    w = _weight(128, 512)
    w[5, 0:3 * (MAX_ENTRIES + 1):3] = 0.0  # 65 zeros in columns 0..192 of one tile: 43 in 0..127, 22 in 128..255
    p = pack(w)
    assert torch.equal(p.weight(), w)
    listed = p.corr_cols[0][p.corr_rows[0] >= 0]
    assert torch.equal(listed, listed.sort().values)  # by column
    lo, hi = p.corr_start[0, 0].item(), p.corr_start[0, 2].item()  # the entries of columns 0..127
    assert hi - lo == int(((p.corr_cols[0] < 128) & (p.corr_rows[0] >= 0)).sum()) >= 43
    for split in (1, 2):  # splits of 512 and 256 columns hold all 65
        with pytest.raises(ValueError, match=f"SPLIT_K={split} .* split K more ways \\(SPLIT_K 4 fit\\)"):
            p.split_entries(128, split)
    assert p.split_entries(128, 4) == 64
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="split K more ways"):
        quant.exp12_linear(x, p, config={"BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 2})
    torch.testing.assert_close(quant.exp12_linear(x, p, config={"BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 4}),
                               x @ w.T)


def test_config_names_the_key_or_value():
    assert exp12_config(None) == {"BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 1}
    with pytest.raises(ValueError, match="keys \\['SPLIT_N'\\] unknown"):
        exp12_config({"SPLIT_N": 2})
    with pytest.raises(ValueError, match="STAGES=5"):
        exp12_config({"STAGES": 5})
    with pytest.raises(ValueError, match="SPLIT_K=9: an integer from 1 to 8"):
        exp12_config({"SPLIT_K": 9})
    w = pack(_weight(256, 512))
    with pytest.raises(ValueError, match="K=512 is 4 tiles of 128 columns, too few for every split"):
        quant.exp12_linear(torch.randn(2, 512).to(torch.bfloat16), w, config={"SPLIT_K": 3})
    table = GemmTable("cpu", {"512x128:bfloat16:bfloat16": {8: {"impl": "exp12", "config": {"BLOCK_K": 32}}}})
    assert table.problems() == ["entry 512x128:bfloat16:bfloat16 at 8 rows: exp12 BLOCK_K=32: one of 64, 128"]


def test_k_is_split_where_the_tiles_are_few():
    assert all("SPLIT_K" not in c for c in exp12_tiles(28672, 132))  # gate/up: 224 tiles, more than a wave
    assert {c["SPLIT_K"] for c in exp12_tiles(4096, 132)} == {4}  # o and down: 32 tiles -> 128 programs
    assert {c["SPLIT_K"] for c in exp12_tiles(6144, 132)} == {2}  # qkv: 48 tiles -> 96
    assert {c["SPLIT_K"] for c in exp12_tiles(4096, 78)} == {2}  # fewer multiprocessors, fewer splits


def test_the_product_off_the_gpu_is_the_bf16_weights():
    w = _weight(256, 512)
    x = torch.randn(6, 512).to(torch.bfloat16)
    norm = RowNorm(torch.rand(3, 6) * 100 + 1, 1e-5)
    residual = torch.randn(6, 256).to(torch.bfloat16)
    for glu, kw in ((True, {"norm": norm}), (False, {"bias": torch.randn(256).to(torch.bfloat16)}),
                    (False, {"norm": norm, "residual": residual, "config": {"SPLIT_K": 2}})):
        got = quant.exp12_linear(x, pack(w, glu=glu), **kw)
        want = quant._reference(x, w, None, kw.get("bias"), glu, None, kw.get("norm"), kw.get("residual"))
        assert all(torch.equal(g, h) for g, h in zip(got, want)) if "residual" in kw else torch.equal(got, want)
    with pytest.raises(ValueError, match="the residual add follows a plain product"):
        quant.exp12_linear(x, pack(w, glu=True), residual=residual)
    with pytest.raises(ValueError, match="1..64 bf16 rows of 512 columns"):
        quant.exp12_linear(torch.randn(65, 512).to(torch.bfloat16), pack(w))


@pytest.mark.parametrize("glu, row_norm, block_k, stages, split_k, residual",
                         [(True, True, 128, 4, 1, False), (False, False, 64, 8, 1, False),
                          (False, True, 128, 4, 2, False), (False, False, 128, 4, 4, True)],
                         ids=["gate-up", "plain", "qkv-split", "down-split-residual"])
def test_the_kernel_compiles_for_sm90_without_spills(glu, row_norm, block_k, stages, split_k, residual):
    pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon")
    from benchmarks.gemv_registers import _ptxas
    from shardline.kernels.gluon_exp12 import compile_for_sm90
    kernel = compile_for_sm90(glu=glu, row_norm=row_norm, block_k=block_k, stages=stages, entries=MAX_ENTRIES,
                              split_k=split_k, residual=residual)
    ptx = kernel.asm["ptx"]
    regs, spills = _ptxas(ptx)
    assert spills == 0 and kernel.metadata.shared <= quant.RING_SMEM_BYTES
    assert ptx.count("prmt.b32") >= 4 and "ld.shared.b16" not in ptx and "wgmma.mma_async" in ptx
    assert "griddepcontrol.wait" in ptx


def _llama(entries: dict[str, dict]):
    """LLAMA_SMALL with a table giving each linear named in `entries` (qkv_proj, o_proj, up_proj,
    down_proj, lm_head) its entry at 8 rows."""
    from shardline.config import ModelConfig
    from shardline.model.random_weights import LLAMA_SMALL, random_manifest, random_stage_weights
    from shardline.model.transformer import StageModel
    from shardline.parallel import single_rank
    cfg = ModelConfig(**LLAMA_SMALL)
    weights = random_stage_weights(random_manifest(cfg, "bf16"), 0, 0, "cpu", seed=3)
    model = StageModel(cfg, single_rank(), weights, 0, cfg.num_layers, True, True)
    owner = {"lm_head": model}
    table = {}
    for name, entry in entries.items():
        n, k = getattr(owner.get(name, model.layers[0]), name).weight.shape
        table[key(n, k, torch.bfloat16, torch.bfloat16)] = {8: entry}
    model.configure_gemms(GemmTable("cpu", table))
    return model, cfg


def _step(model, step):
    ids, meta, caches = step
    with torch.inference_mode():
        return model.forward(ids, meta, [(k.clone(), v.clone()) for k, v in caches])


def test_a_tables_exp12_entries_pack_a_layers_products_and_the_step_is_unchanged(monkeypatch):
    """Gate/up (the norm folded in, SwiGLU after), qkv (the norm folded in), o and down (K split,
    the residual added after) in the 12-bit form: the decode step's logits are the bf16 weights'."""
    from tests.test_norm_fold import _decode_step
    calls = []
    real = quant.exp12_linear
    monkeypatch.setattr(quant, "exp12_linear", lambda x, packed, *a, **kw: calls.append(
        (packed.glu, kw.get("norm"), kw.get("residual"))) or real(x, packed, *a, **kw))
    split = {"impl": "exp12", "config": {"BLOCK_K": 64, "STAGES": 4, "SPLIT_K": 2}}
    model, cfg = _llama({"up_proj": {"impl": "exp12", "config": {"BLOCK_K": 128, "STAGES": 4}},
                         "qkv_proj": split, "o_proj": split, "down_proj": split})
    for layer in model.layers:
        assert layer.up_proj.exp12.glu and not any(lin.exp12.glu for lin in (layer.qkv_proj, layer.o_proj,
                                                                              layer.down_proj))
    step = _decode_step(cfg, 6, 40)
    got = _step(model, step)
    assert len(calls) == 4 * cfg.num_layers, "every layer's four products in the 12-bit form"
    if not _dispatch.TRITON_INTERPRET:  # interpreted, CPU tensors take the kernels' paths: no fold without entries
        assert [(glu, isinstance(norm, RowNorm), residual is not None) for glu, norm, residual in calls[:4]] == \
            [(False, True, False), (False, False, True), (True, True, False), (False, False, True)], \
            "qkv and gate/up with the norm folded in, o and down with the residual added"
    want = _step(_llama({})[0], step)
    if _dispatch.TRITON_INTERPRET:  # the plain model's products are the kernels' here, summed in their order
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    else:  # both the references': the same sums
        assert torch.equal(got, want)


def test_an_exp12_entry_for_the_head_is_warned_and_runs_the_default(caplog):
    with caplog.at_level(logging.WARNING):
        model, _ = _llama({"lm_head": {"impl": "exp12", "config": None}})
    assert "which the 12-bit kernel does not run" in caplog.text
    x = torch.randn(8, model.lm_head.weight.shape[1]).to(torch.bfloat16)
    assert model.lm_head.exp12 is None and model.lm_head._choice(x) is None


def test_an_entry_whose_k_split_cannot_hold_its_corrections_is_warned_and_runs_the_default(caplog):
    """Down (K 4 times gate/up's) lists about 4 times the corrections a tile: an entry whose split
    cannot hold its share is warned at load, and those batch sizes run the default path; one whose
    split can runs the 12-bit kernel."""
    from shardline.model.layers import Linear
    w = _weight(128, 512)
    w[5, :56], w[6, 64:104] = 0.0, 0.0  # 96 in columns 0..127: no split of BLOCK_K 128 holds them, of 64 columns does
    lin = Linear(w)
    k = key(128, 512, torch.bfloat16, torch.bfloat16)
    entries = {8: {"impl": "exp12", "config": {"BLOCK_K": 128, "STAGES": 4, "SPLIT_K": 4}},
               64: {"impl": "exp12", "config": {"BLOCK_K": 64, "STAGES": 8, "SPLIT_K": 8}}}
    lin.gemms = GemmTable("cpu", {k: entries})
    with caplog.at_level(logging.WARNING):
        lin.prepare_exp12(glu=False)
    assert lin.exp12 is not None
    assert "at 8 rows: the 12-bit form: 9" in caplog.text and "SPLIT_K=4" in caplog.text
    assert "no finer split of BLOCK_K=128 holds them" in caplog.text
    assert "at 64 rows" not in caplog.text
    assert lin._choice(torch.empty(8, 512, dtype=torch.bfloat16)) is None
    assert lin._choice(torch.empty(64, 512, dtype=torch.bfloat16))["impl"] == "exp12"
    x = torch.randn(64, 512, dtype=torch.bfloat16)
    torch.testing.assert_close(lin(x), x @ w.T)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64])
def test_the_kernel_multiplies_by_the_weight_packed(device, m):
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the kernel is Gluon for Hopper (TMA, wgmma with a register operand); Triton's interpreter "
                    "does not run Gluon, and the form's CPU tests are above")
    w = _weight(384, 960, device)  # 3 tiles; K a multiple of 64, not of 128: a partial last tile
    # weights over the window (stored as its floor, as below-window ones are, but whose correction
    # shows: a zero's is x * 2^-19), in the first split's columns and in the last's where K splits
    w[3, 100], w[5, 900] = 64.0, -64.0
    x = torch.randn(m, 960, device=device).to(torch.bfloat16)
    plain = pack(w)
    floor_w = unpack(plain.b_plane, plain.n_plane, plain.base)  # what the loop multiplies, uncorrected
    norm = RowNorm(torch.rand(3, m, device=device) * 100 + 1, 1e-5)
    residual = (torch.randn(m, 384, device=device) * 4).to(torch.bfloat16)
    cases = [(True, {"norm": norm}, {}), (False, {"bias": torch.randn(384, device=device).to(torch.bfloat16)}, {}),
             (True, {}, {"BLOCK_K": 64, "STAGES": 8}), (True, {"norm": norm}, {"SPLIT_K": 2}),
             (False, {"residual": residual}, {"BLOCK_K": 64, "STAGES": 4, "SPLIT_K": 3}),
             (False, {"norm": norm, "residual": residual}, {"SPLIT_K": 4})]
    for glu, kw, cfg in cases:
        args = (None, kw.get("bias"), glu, None, kw.get("norm"), kw.get("residual"))
        got = quant.exp12_linear(x, pack(w, glu=glu), config=cfg, **kw)
        want, uncorrected = quant._reference(x, w, *args), quant._reference(x, floor_w, *args)
        if "residual" in kw:  # (the stream, each tile's partial sums of squares of its rows)
            (got, parts), (want, want_ss), (uncorrected, _) = got, want, uncorrected
            assert parts.shape == (3, m)
            torch.testing.assert_close(parts.sum(0), want_ss[0], rtol=2e-2, atol=1e-2)
        got, want, uncorrected = got.float(), want.float(), uncorrected.float()
        tol = 2e-2 * want.abs() + 2e-2
        assert ((got - want).abs() <= tol).all(), (glu, kw.keys(), cfg, (got - want).abs().max())
        assert ((uncorrected - want).abs() > 5 * tol).any(), "the test's correction would not show"


@pytest.mark.gpu
def test_each_k_split_corrects_its_own_run_of_a_long_list(device):
    """A tile listing 160 corrections (more than one list of 64, as Llama-3-8B's down does): each
    of 4 K splits takes its own columns' run of them."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the kernel is Gluon for Hopper; the lists' CPU tests are above")
    w = _weight(256, 1024, device)
    rows, cols = torch.arange(160, device=device) % 128, torch.arange(0, 1024, 6, device=device)[:160]
    w[rows, cols] = 0.0  # about 40 in each quarter of K
    big = torch.tensor([0, 50, 90, 140], device=device)  # columns 0, 300, 540, 840: one in each split's run
    w[rows[big], cols[big]] = 64.0  # over the window: a correction that shows (a zero's is x * 2^-19)
    x = torch.randn(64, 1024, device=device).to(torch.bfloat16)
    packed = pack(w)
    assert packed.unfit({"SPLIT_K": 1}) and packed.unfit({"SPLIT_K": 4}) is None
    floor_w = unpack(packed.b_plane, packed.n_plane, packed.base)
    residual = torch.randn(64, 256, device=device).to(torch.bfloat16)
    got, _ = quant.exp12_linear(x, packed, config={"SPLIT_K": 4}, residual=residual)
    want = (x.float() @ w.float().T + residual.float())
    uncorrected = (x.float() @ floor_w.float().T + residual.float())
    tol = 2e-2 * want.abs() + 2e-2
    assert ((got.float() - want).abs() <= tol).all(), (got.float() - want).abs().max()
    for r in rows[big].tolist():  # each split's correction shows in its row
        assert ((uncorrected - want)[:, r].abs() > 5 * tol[:, r]).any(), f"row {r}: the correction would not show"
