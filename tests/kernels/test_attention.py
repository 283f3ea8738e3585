from __future__ import annotations

import pytest
import torch

from kernel_testing import (ROTATED_ATOL, assert_close, assert_exact, assert_fp8_matches, poison_allocator,
                            skip_interpreted_bf16_dot)
from shardline.kernels import _dispatch
from shardline.kernels.attention import KVScales, paged_attention, paged_attention_ref, write_kv, write_kv_ref


def make_paged_batch(seqs, num_heads, num_kv_heads, head_dim, block_size=16, dtype=torch.float32,
                     device="cpu", extra_blocks=3, cache_dtype=None):
    """A ragged batch over a paged cache with shuffled blocks.

    seqs: (context already cached, new query tokens) per sequence. Returns q and the keyword
    arguments of paged_attention; the cache (of `cache_dtype`, default q's) holds every sequence's
    context + query k/v.
    """
    seq_lens = [c + n for c, n in seqs]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(max(blocks_per_seq), 1) + 1
    num_blocks = sum(blocks_per_seq) + extra_blocks
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    q_lens = [n for _, n in seqs]
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), num_heads, head_dim, dtype=dtype, device=device)
    cache_dtype = cache_dtype or dtype
    return q, dict(k_cache=torch.randn(shape, device=device).to(cache_dtype),
                   v_cache=torch.randn(shape, device=device).to(cache_dtype),
                   block_tables=block_tables.to(device),
                   seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                   query_start_loc=query_start_loc.to(device), scale=head_dim ** -0.5)


def naive_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    """Token by token, head by head, in float64: the definition in attention.py's docstring."""
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // nkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(len(seq_lens)):
        lo, hi, seq_len = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(seq_lens[b])
        for j, t in enumerate(range(lo, hi)):
            pos = seq_len - (hi - lo) + j
            for h in range(q.shape[1]):
                keys, values = [], []
                for p in range(pos + 1):
                    blk, off = int(block_tables[b, p // block_size]), p % block_size
                    keys.append(k_cache[blk, off, h // group].double())
                    values.append(v_cache[blk, off, h // group].double())
                scores = torch.stack(keys) @ q[t, h].double() * scale
                out[t, h] = torch.softmax(scores, 0) @ torch.stack(values)
    return out


MIXED = [(0, 5), (10, 1), (17, 3), (0, 1), (33, 1), (3, 0), (15, 2)]


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(6, 2, 16), (4, 4, 64)])
def test_paged_attention_ref_matches_naive(num_heads, num_kv_heads, head_dim):
    q, kw = make_paged_batch(MIXED, num_heads, num_kv_heads, head_dim)
    torch.testing.assert_close(paged_attention_ref(q, **kw).double(), naive_attention(q, **kw),
                               rtol=1e-5, atol=1e-5)


def test_write_kv_ref_matches_a_loop():
    k, v = torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    kc, vc = torch.zeros(4, 16, 2, 16), torch.zeros(4, 16, 2, 16)
    slots = torch.tensor([3, 60, 17, 16, 0, 33, 5])
    write_kv_ref(k, v, kc, vc, slots)
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(kc[s // 16, s % 16], k[t]) and torch.equal(vc[s // 16, s % 16], v[t])


FP8 = torch.float8_e4m3fn


def test_fp8_cache_reference_rounds_saturates_and_widens():
    """An fp8 cache keeps no scale: the reference writes k and v rounded to e4m3, saturating at
    +-448, and attention over the cache is attention over those values widened to q's dtype."""
    k, v = torch.randn(7, 2, 16) * 300, torch.randn(7, 2, 16)  # some of k past 448
    kc, vc = torch.zeros(4, 16, 2, 16, dtype=FP8), torch.zeros(4, 16, 2, 16, dtype=FP8)
    slots = torch.tensor([3, 60, 17, 16, 0, 33, 5])
    write_kv_ref(k, v, kc, vc, slots)
    assert k.abs().max() > 448 and kc.float().abs().max() == 448, "saturated, not NaN"
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(kc[s // 16, s % 16].float(), k[t].clamp(-448, 448).to(FP8).float())
        assert torch.equal(vc[s // 16, s % 16].float(), v[t].to(FP8).float())
    q, kw = make_paged_batch(MIXED, 6, 2, 16, cache_dtype=FP8)
    wide = dict(kw, k_cache=kw["k_cache"].float(), v_cache=kw["v_cache"].float())
    assert torch.equal(paged_attention_ref(q, **kw), paged_attention_ref(q, **wide))


SCALES = [KVScales(), KVScales(0.37, 0.019)]
SCALE_IDS = ["unscaled", "scaled"]


def test_fp8_cache_scales_keep_keys_off_saturation_and_values_off_subnormals():
    """Keys of magnitude ~2,000 saturate an unscaled e4m3 cache and values of ~0.003 fall into its
    subnormals; with each tensor's scale (its largest magnitude / 448) both keep e4m3's relative
    precision, and attention over the cache stays near attention over the exact K and V. The
    cache holds value / scale; attention multiplies back."""
    torch.manual_seed(0)
    q, kw = make_paged_batch(MIXED, 6, 2, 16)
    kw["k_cache"].mul_(2000.0)
    kw["v_cache"].mul_(0.003)
    exact = paged_attention_ref(q, **kw).double()
    scales = KVScales(kw["k_cache"].abs().max().item() / 448, kw["v_cache"].abs().max().item() / 448)

    def error(kv_scales: KVScales) -> float:
        k, v = torch.zeros_like(kw["k_cache"], dtype=FP8), torch.zeros_like(kw["v_cache"], dtype=FP8)
        nkv, hd = k.shape[2], k.shape[3]
        slots = torch.arange(k.shape[0] * k.shape[1])
        write_kv_ref(kw["k_cache"].view(-1, nkv, hd), kw["v_cache"].view(-1, nkv, hd), k, v, slots, kv_scales)
        if kv_scales != KVScales():
            assert k.float().abs().max() == 448 and torch.equal(
                k.float(), (kw["k_cache"] * (1 / kv_scales.k)).clamp(-448, 448).to(FP8).float())
        out = paged_attention_ref(q, **dict(kw, k_cache=k, v_cache=v), kv_scales=kv_scales).double()
        return ((out - exact).norm() / exact.norm()).item()

    scaled, unscaled = error(scales), error(KVScales())
    assert scaled < 0.1, f"attention over the scaled e4m3 cache is {scaled:.3f} off"
    assert unscaled > 5 * scaled, f"unscaled {unscaled:.3f} against scaled {scaled:.3f}: the case is not one scales fix"


def test_a_bad_checkpoint_scale_is_named():
    with pytest.raises(ValueError, match=r"layer 3: v_scale is 0.0; a KV-cache scale must be positive and finite"):
        KVScales.check(0.5, 0.0, "layer 3")
    with pytest.raises(ValueError, match=r"k_scale is nan"):
        KVScales.check(float("nan"), 1.0, "layer 3")
    assert KVScales.check(0.5, 2, "layer 3") == KVScales(0.5, 2.0)


def test_public_names_run_the_reference_on_cpu():
    q, kw = make_paged_batch(MIXED, 6, 2, 16)
    if _dispatch.use_triton(q):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    assert torch.equal(paged_attention(q, **kw), paged_attention_ref(q, **kw))


def test_disable_env_var_is_read_at_import():
    import subprocess
    import sys
    code = "from shardline.kernels import _dispatch, norm; import torch; " \
           "assert _dispatch.TRITON_DISABLED and not _dispatch.use_triton(torch.zeros(1))"
    env = {"SHARDLINE_DISABLE_TRITON": "1", "PATH": ""}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [(6, 2, 64), (32, 8, 128), (4, 4, 16), (16, 16, 256)]


def _check(q, kw, what, kv_scales=KVScales(), **hints):
    poison_allocator(q)
    out = paged_attention(q, **kw, **hints, kv_scales=kv_scales)
    assert_close(out, paged_attention_ref(q, **kw, kv_scales=kv_scales), what)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", HEADS)
@pytest.mark.parametrize("one_row_hint", [False, True])
def test_decode_triton(device, dtype, num_heads, num_kv_heads, head_dim, one_row_hint):
    """A decode batch, found as such from its shape or told (max_query_len=1: the kernel takes
    row r as sequence r without searching query_start_loc)."""
    skip_interpreted_bf16_dot(device, dtype)
    ctx = [0, 14, 15, 16, 99, 300] if device == "cuda" else [0, 15, 40]
    q, kw = make_paged_batch([(c, 1) for c in ctx], num_heads, num_kv_heads, head_dim, dtype=dtype,
                             device=device)
    _check(q, kw, f"decode batch, one_row_hint={one_row_hint}", **({"max_query_len": 1} if one_row_hint else {}))


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,warps,stages", [(32, 2, 3), (128, 8, 4)])
def test_decode_configs(device, block_n, warps, stages):
    from shardline.kernels.triton_attention import paged_attention_triton
    if not _dispatch.use_triton(torch.empty(0, device=device)):
        pytest.skip("the Triton kernel itself is under test")
    ctx = [1000, 1, 250, 64] if device == "cuda" else [200, 1]
    q, kw = make_paged_batch([(c, 1) for c in ctx], 8, 2, 64, dtype=torch.float16, device=device)
    cfg = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    out = paged_attention_triton(q, **kw, decode_config=cfg)
    assert_close(out, paged_attention_ref(q, **kw), f"decode with {cfg}")


def test_decode_tile_by_rows_and_the_benchmarks_override():
    """2-16 rows take the small-batch tile, 1 and 17+ the default; a benchmark's override changes
    only the keys it names, at every row count, and {} restores the choice."""
    pytest.importorskip("triton", reason="the tile table lives in the Triton kernel's module")
    from shardline.kernels import triton_attention as ta
    small, default, wide = ta.SMALL_BATCH_DECODE_CONFIG, ta.DECODE_CONFIG, ta.WIDE_HEAD_DECODE_CONFIG
    assert small != default
    assert [ta.decode_config_for(r) for r in (1, 2, 16, 17, 64)] == [default, small, small, default, default]
    assert [ta.decode_config_for(r, 256) for r in (1, 2, 64)] == [default, wide, wide], \
        "heads wider than 128 take their own tile above one row"
    assert not wide["FUSE_ROTARY"] and "FUSE_ROTARY" not in default
    fp8, fp8_short = ta.FP8_DECODE_CONFIG, ta.FP8_SHORT_DECODE_CONFIG
    assert [ta.decode_config_for(r, 128, FP8) for r in (1, 16, 64)] == [fp8, fp8, fp8], "no context: long"
    assert [ta.decode_config_for(64, 128, FP8, c) for c in (192, 256, 257, 4096)] == [fp8_short, fp8_short, fp8, fp8]
    assert ta.decode_config_for(64, 128, torch.bfloat16) == default and ta.decode_config_for(64, 256, FP8) == wide
    try:
        ta.DECODE_OVERRIDE = {"num_stages": 3}
        assert ta.decode_config_for(16) == dict(small, num_stages=3)
        assert ta.decode_config_for(64) == dict(default, num_stages=3)
    finally:
        ta.DECODE_OVERRIDE = {}
    assert ta.decode_config_for(16) == small


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 8, 64])
def test_decode_split_k(device, num_splits):
    from shardline.kernels.triton_attention import paged_attention_triton
    ctx = [1000, 1, 250] if device == "cuda" else [200, 1]
    q, kw = make_paged_batch([(c, 1) for c in ctx], 8, 2, 64, dtype=torch.float16, device=device)
    out = paged_attention_triton(q, **kw, num_splits=num_splits)
    assert_close(out, paged_attention_ref(q, **kw), f"decode with {num_splits} context splits")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", HEADS)
def test_mixed_prefill_and_decode_triton(device, dtype, num_heads, num_kv_heads, head_dim):
    skip_interpreted_bf16_dot(device, dtype)
    seqs = MIXED + ([(0, 70), (40, 33), (200, 17)] if device == "cuda" else [(0, 20)])
    q, kw = make_paged_batch(seqs, num_heads, num_kv_heads, head_dim, dtype=dtype, device=device)
    _check(q, kw, "mixed prefill chunks and decode tokens")


@pytest.mark.gpu
def test_batches_past_one_sequence_scan_block(device):
    """Both kernels find a row's sequence by scanning query_start_loc 64 entries at a time (one
    compile for every batch size): sequences past the first 64, in mixed and decode form."""
    seqs = [(i % 7, 1 + (i % 3 == 0) * (i % 5)) for i in range(70)] + [(4, 6)]
    q, kw = make_paged_batch(seqs, 4, 2, 16, device=device)
    _check(q, kw, "71 mixed sequences")
    q, kw = make_paged_batch([(3 + i % 9, 1) for i in range(130)], 4, 2, 16, device=device)
    assert q.shape[0] == 130
    _check(q, kw, "130 decode rows, the per-row kernel searching (no hint that row r is sequence r)")


@pytest.mark.gpu
def test_long_prefill_triton(device):
    if device != "cuda":
        pytest.skip("too slow interpreted")
    q, kw = make_paged_batch([(0, 1100), (77, 300)], 32, 8, 128, dtype=torch.bfloat16, device=device)
    _check(q, kw, "long prefill chunks")


@pytest.mark.gpu
def test_decode_kernel_handles_any_batch_when_told_decode(device):
    """T == B picks the per-row kernel; it must stay right when a sequence has 2 rows, another 0."""
    q, kw = make_paged_batch([(5, 2), (7, 0), (0, 1)], 6, 2, 16, device=device)
    assert q.shape[0] == kw["seq_lens"].shape[0]
    _check(q, kw, "per-row kernel on a batch with q_len 2 and 0")
    _check(q, kw, "tiled kernel on that batch", max_query_len=2)


@pytest.mark.gpu
def test_decode_padding_row_with_empty_context_is_zero(device):
    q, kw = make_paged_batch([(20, 1), (0, 0)], 6, 2, 16, device=device)
    q = torch.cat([q, torch.randn_like(q)])  # row 1 belongs to sequence 1, which has no tokens
    kw["query_start_loc"] = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    out = paged_attention(q, **kw)
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a padding row must read as zeros, not NaN"
    assert_close(out[:1], paged_attention_ref(q, **kw)[:1], "real row beside a padding row")


@pytest.mark.gpu
def test_decode_is_cuda_graph_capturable(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    q, kw = make_paged_batch([(50, 1), (300, 1), (7, 1)], 32, 8, 128, dtype=torch.bfloat16,
                             device=device)
    paged_attention(q, **kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(q, **kw)
    # New step, same shapes: longer contexts, new queries, written into the captured buffers.
    kw["seq_lens"].add_(5)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, paged_attention_ref(q, **kw), "decode replayed from a CUDA graph")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_triton(device, dtype):
    T, nkv, hd = 7, 2, 64
    qkv = torch.randn(T, 10 * hd, device=device, dtype=torch.float32)
    k, v = qkv[:, 6 * hd:8 * hd].view(T, nkv, hd), qkv[:, 8 * hd:].view(T, nkv, hd)  # strided views
    slots = torch.randperm(5 * 16, device=device)[:T]
    caches = [torch.full((5, 16, nkv, hd), float("nan"), device=device, dtype=dtype) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_ref(k, v, caches[2], caches[3], slots)
    for got, want in zip(caches[:2], caches[2:]):
        written = ~want.isnan()
        assert torch.equal(written, ~got.isnan()), "exactly the tokens' slots are written"
        assert_exact(got[written], want[written], "k/v in the cache")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", SCALES, ids=SCALE_IDS)
def test_write_kv_triton_fp8_cache(device, dtype, scales):
    """k/v of any dtype into an fp8 cache: the reference's rounding (of k / the k scale, v / the v
    scale), bit for bit, saturating."""
    T, nkv, hd = 7, 2, 64
    k = (torch.randn(T, nkv, hd, device=device) * 200 * scales.k).to(dtype)
    v = (torch.randn(T, nkv, hd, device=device) * scales.v).to(dtype)
    slots = torch.randperm(5 * 16, device=device)[:T]
    caches = [torch.zeros((5, 16, nkv, hd), device=device, dtype=FP8) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots, scales)
    write_kv_ref(k, v, caches[2], caches[3], slots, scales)
    assert_fp8_matches(caches[0], caches[2], "k in the cache")
    assert_fp8_matches(caches[1], caches[3], "v in the cache")
    assert caches[0].float().abs().max() == 448


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs", [[(0, 1), (15, 1), (40, 1), (130, 1)], MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("scales", SCALES, ids=SCALE_IDS)
def test_attention_over_fp8_cache_triton(device, dtype, seqs, scales):
    """Both attention kernels read an e4m3 cache widened, as the reference does, the k scale in
    the scores' scale and the v scale on the output; a bf16 q's dots with it run in fp16 (which the
    interpreter also runs right, unlike bf16 dots)."""
    q, kw = make_paged_batch(seqs, 32, 8, 128, dtype=dtype, device=device, cache_dtype=FP8)
    _check(q, kw, "attention over an fp8 cache", kv_scales=scales)


@pytest.mark.gpu
def test_write_kv_skips_negative_slots(device):
    k = torch.randn(3, 2, 16, device=device)
    kc = torch.full((2, 16, 2, 16), float("nan"), device=device)
    vc = kc.clone()
    write_kv(k, k, kc, vc, torch.tensor([4, -1, 9], device=device))
    assert (~kc.view(-1, 2, 16).isnan().any(-1).any(-1)).sum() == 2


def _decode_step_with_new_tokens(ctx, nh, nkv, hd, dtype, device, padding_rows=0):
    """A decode batch whose new tokens are not yet rotated or cached: unrotated q, k, v (views of
    one qkv projection, as the model makes them), their positions and cache slots, and the batch.
    Padding rows (context 1, slot -1) follow the real ones, as in a captured graph."""
    seqs = [(c, 1) for c in ctx] + [(0, 1)] * padding_rows
    _, kw = make_paged_batch(seqs, nh, nkv, hd, dtype=dtype, device=device)
    T, block_size = len(seqs), kw["k_cache"].shape[1]
    qkv = torch.randn(T, (nh + 2 * nkv) * hd, dtype=dtype, device=device)
    q, k, v = (qkv[:, :nh * hd].view(T, nh, hd), qkv[:, nh * hd:(nh + nkv) * hd].view(T, nkv, hd),
               qkv[:, (nh + nkv) * hd:].view(T, nkv, hd))
    positions = (kw["seq_lens"] - 1).long()
    tables = kw["block_tables"].long()
    slots = tables[torch.arange(T, device=device), positions // block_size] * block_size + positions % block_size
    slots[len(ctx):] = -1
    return q, k, v, positions, slots, kw


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,hd,rd", [(6, 2, 64, 64), (32, 8, 128, 128), (4, 4, 96, 48)])
@pytest.mark.parametrize("num_splits", [1, 2, 8])
@pytest.mark.parametrize("form", [{}, {"EARLY_KV": True}, {"OPAQUE_BT": True, "num_stages": 4}, {"NEW_FIRST": True},
                                  {"NEW_FIRST": True, "OPAQUE_BT": True, "num_stages": 4}],
                         ids=["", "early_kv", "opaque_bt", "new_first", "new_first_opaque_bt"])
def test_rotary_decode_attention_triton(device, dtype, nh, nkv, hd, rd, num_splits, form):
    """One kernel (rotary, cache write, attention over the new token from registers) against the
    references run in turn, with context splits that do and do not hold the new token alone, with
    the first cached tile read before the PDL wait (EARLY_KV; context 0 leaves it empty), with
    block ids read so that the K/V tiles pipeline three deep (OPAQUE_BT; on the GPU only), and
    with the new token read and written before the loop (NEW_FIRST)."""
    from shardline.kernels.rotary import apply_rotary_and_write_kv_ref, rotary_cos_sin
    from shardline.kernels.triton_attention import decode_config_for, paged_attention_triton
    skip_interpreted_bf16_dot(device, dtype)
    if not _dispatch.use_triton(torch.empty(0, device=device)):
        pytest.skip("the Triton kernel itself is under test")
    ctx = [0, 14, 15, 16, 99, 300] if device == "cuda" else [0, 15, 40]
    q, k, v, positions, slots, kw = _decode_step_with_new_tokens(ctx, nh, nkv, hd, dtype, device, padding_rows=2)
    cos_sin = rotary_cos_sin(4096, rd, 10000.0, None, device=device)
    real = len(ctx)
    want_k, want_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    rq = apply_rotary_and_write_kv_ref(q[:real], k[:real], v[:real], positions[:real], cos_sin, rd, want_k, want_v,
                                       slots[:real])
    ref_kw = dict(kw, k_cache=want_k, v_cache=want_v)
    want = paged_attention_ref(torch.cat([rq, q[real:]]), **ref_kw)
    before_k, before_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    poison_allocator(q)
    # The splits come as the config's key here (how an A/B forces them), as the argument above.
    out = paged_attention_triton(q, **kw, max_query_len=1, rotary=(k, v, positions, cos_sin, rd, slots),
                                 decode_config=dict(decode_config_for(len(q)), splits=num_splits, **form))
    assert_close(out[:real], want[:real], f"attention with rotary fused, {num_splits} splits")
    assert torch.isfinite(out).all(), "padding rows must not produce NaN"
    written = torch.zeros(kw["k_cache"].shape[:2], dtype=torch.bool, device=device).view(-1)
    written[slots[:real]] = True
    written = written.view(kw["k_cache"].shape[:2])
    assert_close(kw["k_cache"][written], want_k[written], "rotated new keys in the cache")
    assert_exact(kw["v_cache"][written], want_v[written], "new values in the cache")
    assert torch.equal(kw["k_cache"][~written], before_k[~written]) and \
        torch.equal(kw["v_cache"][~written], before_v[~written]), "only the real rows' slots are written"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 8])
@pytest.mark.parametrize("scales", SCALES, ids=SCALE_IDS)
def test_rotary_decode_attention_triton_fp8_cache(device, dtype, num_splits, scales):
    """The fused kernel over an fp8 cache: the new key and value rounded to e4m3 as the reference
    writes them, and attended over at that rounding (as the cached tokens are). A bf16 q's dots
    run in fp16 over the e4m3 cache, so the interpreter runs this one right too."""
    from shardline.kernels.rotary import apply_rotary_and_write_kv_ref, rotary_cos_sin
    from shardline.kernels.triton_attention import decode_config_for, paged_attention_triton
    if not _dispatch.use_triton(torch.empty(0, device=device)):
        pytest.skip("the Triton kernel itself is under test")
    ctx = [0, 14, 15, 16, 99, 300] if device == "cuda" else [0, 15, 40]
    q, k, v, positions, slots, kw = _decode_step_with_new_tokens(ctx, 32, 8, 128, dtype, device, padding_rows=2)
    kw = dict(kw, k_cache=kw["k_cache"].to(FP8), v_cache=kw["v_cache"].to(FP8))
    cos_sin = rotary_cos_sin(4096, 128, 10000.0, None, device=device)
    real = len(ctx)
    want_k, want_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    rq = apply_rotary_and_write_kv_ref(q[:real], k[:real], v[:real], positions[:real], cos_sin, 128, want_k, want_v,
                                       slots[:real], scales)
    out = paged_attention_triton(q, **kw, max_query_len=1, rotary=(k, v, positions, cos_sin, 128, slots),
                                 decode_config=dict(decode_config_for(len(q), 128, FP8), splits=num_splits),
                                 kv_scales=scales)
    assert_fp8_matches(kw["k_cache"], want_k, "rotated new keys in the cache", ulps=1, atol=ROTATED_ATOL / scales.k)
    assert_fp8_matches(kw["v_cache"], want_v, "new values in the cache")
    # The new token is attended over as it was written (the reference reads the kernel's cache).
    want = paged_attention_ref(torch.cat([rq, q[real:]]), **kw, kv_scales=scales)
    assert_close(out[:real], want[:real], f"attention with rotary fused over an fp8 cache, {num_splits} splits")


@pytest.mark.gpu
@pytest.mark.parametrize("rows,hd,rd", [(3, 64, 64), (70, 64, 64), (1, 256, 64), (3, 256, 64)])
def test_rotary_decode_attention_public_name(device, rows, hd, rd):
    """The engine's entry point: on the GPU the fused kernel up to FUSED_ROTARY_MAX_ROWS rows, and
    the rotary kernel + attention above them or where the decode config says FUSE_ROTARY False
    (heads wider than 128, above one row: GPT-J's); the references in turn elsewhere."""
    from shardline.kernels.attention import FUSED_ROTARY_MAX_ROWS, rotary_decode_attention
    from shardline.kernels.rotary import apply_rotary_and_write_kv_ref, rotary_cos_sin
    assert 3 <= FUSED_ROTARY_MAX_ROWS < 70, "the two cases should take the two paths"
    if device != "cuda" and rows > 8:
        pytest.skip("too slow interpreted")
    ctx = [(7 * i) % 61 + 1 for i in range(rows)]
    q, k, v, positions, slots, kw = _decode_step_with_new_tokens(ctx, 8, 2 if hd == 64 else 8, hd, torch.float32,
                                                                 device)
    cos_sin = rotary_cos_sin(256, rd, 10000.0, None, device=device)
    want_k, want_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    rq = apply_rotary_and_write_kv_ref(q, k, v, positions, cos_sin, rd, want_k, want_v, slots)
    want = paged_attention_ref(rq, **dict(kw, k_cache=want_k, v_cache=want_v))
    out = rotary_decode_attention(q, k, v, positions, cos_sin, rd, kw["k_cache"], kw["v_cache"], slots,
                                  kw["block_tables"], kw["seq_lens"], kw["query_start_loc"], kw["scale"])
    assert_close(out, want, "rotary decode attention")
    assert_close(kw["k_cache"], want_k, "the cache after the step")


def test_decode_splits_not_a_power_of_two_are_named():
    """A forced split count the combine kernel cannot take is a ValueError before any launch."""
    pytest.importorskip("triton", reason="the Triton wrapper checks it")
    from shardline.kernels.triton_attention import paged_attention_triton
    q, kw = make_paged_batch([(5, 1), (9, 1)], 4, 2, 16)
    for bad in (3, 128):
        with pytest.raises(ValueError, match=f"splits={bad}: a power of two"):
            paged_attention_triton(q, **kw, max_query_len=1, decode_config={"splits": bad})
