"""Triton rotary embedding (rotate-half over the first rotary_dim dims), optionally fused with the
KV-cache write. Imported only when a CUDA tensor arrives.

One program per token rotates all of its q and k heads (and, fused, stores the rotated k and the
untouched v straight into their cache slots, so k never makes a round trip through memory).
Rounding follows the reference: cos/sin are rounded to the activation dtype, each product and the
sum are rounded to it too. Tokens whose slot is negative (padding rows of a captured batch) are
rotated but not written to the cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import next_pow2, pdl_args
from .attention import NO_SCALES, inverse
from .triton_pdl import pdl_wait


@triton.jit
def load_rotated(base, d, mask, cs_row, HALF: tl.constexpr, ROT: tl.constexpr):
    """x[base + d] rotated rotate-half over its first ROT dims by the cos/sin row `cs_row` (cos of
    the HALF frequencies, then their sin); other dims as loaded. Rounding follows the reference:
    cos/sin, each product and their sum are rounded to x's dtype. The rotary kernel below and the
    fused decode attention (triton_attention.py) both rotate through this."""
    x = tl.load(base + d, mask=mask, other=0.0)
    in_rot = d < ROT
    first = d < HALF
    partner = tl.load(base + tl.where(first, d + HALF, d - HALF), mask=mask & in_rot, other=0.0)
    j = tl.where(first, d, d - HALF)
    dt = x.dtype
    c = tl.load(cs_row + j, mask=in_rot, other=0.0).to(dt).to(tl.float32)
    s = tl.load(cs_row + HALF + j, mask=in_rot, other=0.0).to(dt).to(tl.float32)
    sign = tl.where(first, -1.0, 1.0)
    rotated = (x.to(tl.float32) * c).to(dt).to(tl.float32) + (sign * partner.to(tl.float32) * s).to(dt).to(tl.float32)
    return tl.where(in_rot, rotated.to(dt), x)


@triton.jit
def as_cached(x, cache_ptr, inv_scale):
    """x in the element type of `cache_ptr`, a KV cache: fp8 (e4m3) times `inv_scale` (the fp32
    inverse of the layer's scale), saturating at +-448, as attention.as_cached does (a bare cast
    leaves out-of-range values to the backend). Any other type ignores the scale."""
    ty = cache_ptr.dtype.element_ty
    if ty == tl.float8e4nv:
        return tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0).to(ty)
    return x.to(ty)


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_src_h, stride_dst_h, n_heads, cs_row, inv_scale,
                  HALF: tl.constexpr, ROT: tl.constexpr, HEAD_DIM: tl.constexpr,
                  HEADS_P2: tl.constexpr, HEAD_DIM_P2: tl.constexpr):
    """src/dst point at one token's head 0; heads are stride_*_h apart, dims contiguous. dst is
    q's output or a KV cache (of any dtype as_cached takes, with its inverse scale)."""
    heads = tl.arange(0, HEADS_P2)[:, None]
    dims = tl.arange(0, HEAD_DIM_P2)[None, :]
    mask = (heads < n_heads) & (dims < HEAD_DIM)
    x = load_rotated(src_ptr + heads * stride_src_h, dims, mask, cs_row, HALF, ROT)
    tl.store(dst_ptr + heads * stride_dst_h + dims, as_cached(x, dst_ptr, inv_scale), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, cos_sin_ptr, q_out_ptr, k_out_ptr,
                   k_cache_ptr, v_cache_ptr, slot_ptr,
                   stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
                   stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,
                   stride_c_slot, stride_c_h, stride_cs, n_heads, n_kv_heads, k_inv_scale, v_inv_scale,
                   HALF: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
                   HEADS_P2: tl.constexpr, KV_HEADS_P2: tl.constexpr, WRITE_KV: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cs_row = cos_sin_ptr + tl.load(pos_ptr + t).to(tl.int64) * stride_cs
    _rotate_heads(q_ptr + t * stride_q_t, q_out_ptr + t * stride_qo_t, stride_q_h, stride_qo_h,
                  n_heads, cs_row, 1.0, HALF, 2 * HALF, HEAD_DIM, HEADS_P2, HEAD_DIM_P2)
    if WRITE_KV:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            _rotate_heads(k_ptr + t * stride_k_t, k_cache_ptr + slot * stride_c_slot, stride_k_h,
                          stride_c_h, n_kv_heads, cs_row, k_inv_scale, HALF, 2 * HALF, HEAD_DIM, KV_HEADS_P2, HEAD_DIM_P2)
            heads = tl.arange(0, KV_HEADS_P2)[:, None]
            dims = tl.arange(0, HEAD_DIM_P2)[None, :]
            mask = (heads < n_kv_heads) & (dims < HEAD_DIM)
            v = tl.load(v_ptr + t * stride_v_t + heads * stride_v_h + dims, mask=mask)
            tl.store(v_cache_ptr + slot * stride_c_slot + heads * stride_c_h + dims,
                     as_cached(v, v_cache_ptr, v_inv_scale), mask=mask)
    else:
        _rotate_heads(k_ptr + t * stride_k_t, k_out_ptr + t * stride_ko_t, stride_k_h, stride_ko_h,
                      n_kv_heads, cs_row, 1.0, HALF, 2 * HALF, HEAD_DIM, KV_HEADS_P2, HEAD_DIM_P2)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(q, k, v, positions, cos_sin, rotary_dim, k_cache, v_cache, slot_mapping, kv_scales=NO_SCALES):
    T, nh, hd = q.shape
    nkv = k.shape[1]
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    cos_sin = _last_dim_contiguous(cos_sin)
    q_out = torch.empty((T, nh, hd), dtype=q.dtype, device=q.device)
    write_kv = k_cache is not None
    if write_kv:
        v = _last_dim_contiguous(v)
        kc = k_cache.view(-1, nkv, hd)  # (slots, nkv, hd)
        vc = v_cache.view(-1, nkv, hd)
        assert kc.stride() == vc.stride(), "k_cache and v_cache must share one layout"
        k_out, c_strides = q_out, (kc.stride(0), kc.stride(1))
    else:
        v, kc, vc, slot_mapping = k, q_out, q_out, positions  # unused by the kernel
        k_out = torch.empty((T, nkv, hd), dtype=k.dtype, device=k.device)
        c_strides = (0, 0)
    half = rotary_dim // 2
    if T:
        _rotary_kernel[(T,)](
            q, k, v, positions, cos_sin, q_out, k_out, kc, vc, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            c_strides[0], c_strides[1], cos_sin.stride(0), nh, nkv, inverse(kv_scales.k), inverse(kv_scales.v),
            HALF=half, HEAD_DIM=hd, HEAD_DIM_P2=next_pow2(hd), HEADS_P2=next_pow2(nh), KV_HEADS_P2=next_pow2(nkv),
            WRITE_KV=write_kv, num_warps=4, **pdl_args(q))
    return q_out, (None if write_kv else k_out)


def apply_rotary_triton(q, k, positions, cos_sin, rotary_dim):
    return _launch(q, k, None, positions, cos_sin, rotary_dim, None, None, None)


def apply_rotary_and_write_kv_triton(q, k, v, positions, cos_sin, rotary_dim, k_cache, v_cache,
                                     slot_mapping, kv_scales=NO_SCALES):
    return _launch(q, k, v, positions, cos_sin, rotary_dim, k_cache, v_cache, slot_mapping, kv_scales)[0]
