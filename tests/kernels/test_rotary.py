from __future__ import annotations

import pytest
import torch

from kernel_testing import ROTATED_ATOL, assert_close, assert_exact, assert_fp8_matches
from shardline.kernels import _dispatch
from shardline.kernels.attention import KVScales
from shardline.kernels.rotary import (apply_rotary, apply_rotary_and_write_kv,
                                      apply_rotary_and_write_kv_ref, apply_rotary_ref,
                                      rotary_cos_sin, rotary_inv_freq)


def _naive_rotary(x, positions, rotary_dim, theta):
    """Rotate-half as complex multiplication: (x_i + i x_{i+half}) * exp(i pos w_i), in float64."""
    half = rotary_dim // 2
    inv_freq = rotary_inv_freq(rotary_dim, theta, None).double()
    angle = positions.double()[:, None, None] * inv_freq  # (T, 1, half)
    z = torch.complex(x[..., :half].double(), x[..., half:rotary_dim].double()) * torch.polar(
        torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag, x[..., rotary_dim:].double()], dim=-1)


@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 16), (64, 64), (64, 32)])
def test_apply_rotary_ref_matches_complex_rotation(head_dim, rotary_dim):
    T, nh, nkv = 7, 6, 2
    q, k = torch.randn(T, nh, head_dim), torch.randn(T, nkv, head_dim)
    positions = torch.tensor([0, 1, 5, 17, 100, 3, 999])
    cos_sin = rotary_cos_sin(1024, rotary_dim, 10000.0, None)
    rq, rk = apply_rotary_ref(q, k, positions, cos_sin, rotary_dim)
    torch.testing.assert_close(rq.double(), _naive_rotary(q, positions, rotary_dim, 10000.0),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rk.double(), _naive_rotary(k, positions, rotary_dim, 10000.0),
                               rtol=1e-4, atol=1e-4)


def test_fused_ref_writes_rotated_k_and_v_to_their_slots():
    T, nkv, hd = 5, 2, 16
    q, k, v = torch.randn(T, 6, hd), torch.randn(T, nkv, hd), torch.randn(T, nkv, hd)
    positions, slots = torch.arange(3, 3 + T), torch.tensor([17, 3, 40, 41, 0])
    cos_sin = rotary_cos_sin(64, hd, 10000.0, None)
    k_cache, v_cache = torch.zeros(3, 16, nkv, hd), torch.zeros(3, 16, nkv, hd)
    rq = apply_rotary_and_write_kv_ref(q, k, v, positions, cos_sin, hd, k_cache, v_cache, slots)
    want_q, want_k = apply_rotary_ref(q, k, positions, cos_sin, hd)
    assert torch.equal(rq, want_q)
    assert torch.equal(k_cache.view(-1, nkv, hd)[slots], want_k), "cache holds the rotated k"
    assert torch.equal(v_cache.view(-1, nkv, hd)[slots], v)


def test_public_names_run_the_reference_on_cpu():
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    if _dispatch.use_triton(q):
        pytest.skip("TRITON_INTERPRET routes CPU tensors to Triton")
    pos, cs = torch.arange(3), rotary_cos_sin(8, 16, 10000.0, None)
    for got, want in zip(apply_rotary(q, k, pos, cs, 16), apply_rotary_ref(q, k, pos, cs, 16)):
        assert torch.equal(got, want)


def _qkv_views(T, nh, nkv, hd, dtype, device):
    """q, k, v as the model makes them: non-contiguous views of one fused projection output."""
    qkv = torch.randn(T, (nh + 2 * nkv) * hd, device=device, dtype=dtype)
    q = qkv[:, :nh * hd].view(T, nh, hd)
    k = qkv[:, nh * hd:(nh + nkv) * hd].view(T, nkv, hd)
    v = qkv[:, (nh + nkv) * hd:].view(T, nkv, hd)
    return q, k, v


SHAPES = [  # (T, heads, kv heads, head_dim, rotary_dim)
    (7, 6, 2, 64, 64), (5, 6, 2, 16, 16), (3, 16, 16, 256, 64), (9, 32, 8, 128, 128), (1, 4, 4, 96, 48)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,nh,nkv,hd,rd", SHAPES)
def test_apply_rotary_triton(device, dtype, T, nh, nkv, hd, rd):
    q, k, _ = _qkv_views(T, nh, nkv, hd, dtype, device)
    positions = torch.randint(0, 4096, (T,), device=device)
    cos_sin = rotary_cos_sin(4096, rd, 500000.0, None, device=device)
    rq, rk = apply_rotary(q, k, positions, cos_sin, rd)
    want_q, want_k = apply_rotary_ref(q, k, positions, cos_sin, rd)
    assert_close(rq, want_q, "rotated q")
    assert_close(rk, want_k, "rotated k")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,nh,nkv,hd,rd", SHAPES)
def test_apply_rotary_and_write_kv_triton(device, dtype, T, nh, nkv, hd, rd):
    q, k, v = _qkv_views(T, nh, nkv, hd, dtype, device)
    positions = torch.randint(0, 4096, (T,), device=device)
    cos_sin = rotary_cos_sin(4096, rd, 10000.0, None, device=device)
    num_blocks, block_size = 4, 16
    slots = torch.randperm(num_blocks * block_size, device=device)[:T]
    caches = [torch.full((num_blocks, block_size, nkv, hd), float("nan"), device=device, dtype=dtype)
              for _ in range(4)]
    rq = apply_rotary_and_write_kv(q, k, v, positions, cos_sin, rd, caches[0], caches[1], slots)
    want_q = apply_rotary_and_write_kv_ref(q, k, v, positions, cos_sin, rd, caches[2], caches[3], slots)
    assert_close(rq, want_q, "rotated q")
    written = caches[0].view(-1, nkv, hd)[slots]
    assert_close(written, caches[2].view(-1, nkv, hd)[slots], "rotated k in the cache")
    assert_exact(caches[1].view(-1, nkv, hd)[slots], v, "v in the cache")
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=device)
    untouched[slots] = False
    assert caches[0].view(-1, nkv, hd)[untouched].isnan().all(), "only the tokens' slots are written"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", [KVScales(), KVScales(0.37, 0.019)], ids=["unscaled", "scaled"])
def test_apply_rotary_and_write_kv_triton_fp8_cache(device, dtype, scales):
    """The rotary kernel writes e4m3 k and v as the reference rounds them (divided by the layer's
    scales, saturating at +-448)."""
    T, nh, nkv, hd, rd = 9, 32, 8, 128, 128
    q, k, v = _qkv_views(T, nh, nkv, hd, dtype, device)
    v.mul_(200 * scales.v)
    positions = torch.randint(0, 4096, (T,), device=device)
    cos_sin = rotary_cos_sin(4096, rd, 10000.0, None, device=device)
    slots = torch.randperm(4 * 16, device=device)[:T]
    caches = [torch.zeros((4, 16, nkv, hd), device=device, dtype=torch.float8_e4m3fn) for _ in range(4)]
    rq = apply_rotary_and_write_kv(q, k, v, positions, cos_sin, rd, caches[0], caches[1], slots, scales)
    want_q = apply_rotary_and_write_kv_ref(q, k, v, positions, cos_sin, rd, caches[2], caches[3], slots, scales)
    assert_close(rq, want_q, "rotated q")
    assert_fp8_matches(caches[0], caches[2], "rotated k in the cache", ulps=1, atol=ROTATED_ATOL / scales.k)
    assert_fp8_matches(caches[1], caches[3], "v in the cache")
    assert caches[1].float().abs().max() == 448, "saturated, not NaN"


@pytest.mark.gpu
def test_fused_rotary_skips_negative_slots(device):
    q, k, v = _qkv_views(4, 4, 2, 16, torch.float32, device)
    cos_sin = rotary_cos_sin(16, 16, 10000.0, None, device=device)
    k_cache = torch.full((2, 16, 2, 16), float("nan"), device=device)
    v_cache = k_cache.clone()
    slots = torch.tensor([5, -1, 7, -1], device=device)
    apply_rotary_and_write_kv(q, k, v, torch.arange(4, device=device), cos_sin, 16, k_cache,
                              v_cache, slots)
    assert (~v_cache.view(-1, 2, 16).isnan().any(-1).any(-1)).sum() == 2, "padding rows write nothing"
    assert torch.equal(v_cache.view(-1, 2, 16)[[5, 7]], v[[0, 2]])
