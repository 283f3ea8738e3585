"""Attention over the paged KV cache, for ragged batches that mix prefill and decode.

Cache layout, per layer: k_cache and v_cache are [num_blocks, block_size, num_kv_heads, head_dim].
A token's slot is block_id * block_size + offset; `slot_mapping[t]` says where token t's k/v go.
The cache holds the model's dtype, or fp8 (e4m3, `--kv-cache-dtype fp8`): k and v are divided by
their layer's scale (KVScales: per tensor, from the checkpoint, else 1) and rounded to it as they are
written, saturating at +-448, and widened to q's dtype as they are read, the scales applied to the
scores and the output rather than to each element. Over a cache of the model's dtype the scales
are not used.

Batch layout: the T query tokens of B sequences are packed back to back. Sequence b owns query
rows [query_start_loc[b], query_start_loc[b+1]) and, after this step, has seq_lens[b] tokens in
the cache (its queries are the last ones), whose blocks are block_tables[b, :]. Causality:
query j of a chunk of n tokens sits at position seq_len - n + j and sees keys [0, that position].
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_triton
from .quant import FP8_MAX


class KVScales(NamedTuple):
    """One layer's per-tensor scales of an fp8 cache: a cached key is k / `k` in e4m3, read back as
    that times `k` (the same for values). Not used over a cache of the model's dtype."""

    k: float = 1.0
    v: float = 1.0

    @staticmethod
    def check(k: float, v: float, where: str) -> "KVScales":
        """Scales read from a checkpoint: positive and finite, else ValueError naming `where`."""
        for name, value in (("k_scale", k), ("v_scale", v)):
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"{where}: {name} is {value}; a KV-cache scale must be positive and finite")
        return KVScales(float(k), float(v))


NO_SCALES = KVScales()


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def inverse(scale: float) -> float:
    """What a writer multiplies by (the kernels and the reference alike, so that they round alike)."""
    return 1.0 / scale


def as_cached(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x rounded to the cache's dtype; fp8 divides by `scale` (multiplying by its fp32 inverse, as
    the kernels do) and saturates at +-448 (the kernels' rounding too)."""
    if is_fp8(dtype):
        return (x.float() * inverse(scale)).clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_scales: KVScales = NO_SCALES) -> None:
    """k, v [T, nkv, hd] -> cache slots (in place)."""
    nkv, hd = k.shape[1], k.shape[2]
    for x, cache, scale in ((k, k_cache, kv_scales.k), (v, v_cache, kv_scales.v)):
        x = as_cached(x, cache.dtype, scale)
        if cache.element_size() == 1:  # index_copy_ has no fp8 kernel: copy the bytes
            x, cache = x.view(torch.uint8), cache.view(torch.uint8)
        cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, x)


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float,
                        kv_scales: KVScales = NO_SCALES) -> torch.Tensor:
    """q [T, nh, hd] -> out [T, nh, hd]. One sequence at a time: the reference, not the fast path."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales if is_fp8(k_cache.dtype) else NO_SCALES
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q_lo, q_hi = starts[b], starts[b + 1]
        n = q_hi - q_lo
        if n == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_tables[b, :num_blocks].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]  # (S, nkv, hd)
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1).float()  # (nh, S, hd)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1).float()
        if k_scale != 1.0 or v_scale != 1.0:
            k, v = k * k_scale, v * v_scale
        qb = q[q_lo:q_hi].transpose(0, 1).float()  # (nh, n, hd)
        scores = (qb @ k.transpose(1, 2)) * scale  # (nh, n, S)
        q_pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_lo:q_hi] = (probs @ v).transpose(0, 1).to(q.dtype)  # (n, nh, hd)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: KVScales = NO_SCALES) -> None:
    """On the GPU, slots < 0 are skipped (padding rows of a captured batch)."""
    if use_triton(k):
        from .triton_attention import write_kv_triton
        return write_kv_triton(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return write_kv_ref(k, v, k_cache, v_cache, slot_mapping, kv_scales)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, *,
                    max_query_len: int | None = None,
                    max_seq_len: int | None = None, kv_scales: KVScales = NO_SCALES) -> torch.Tensor:
    """On the GPU: never reads device values on the host, so it can be captured in a CUDA graph.

    Optional host-side hints, both safe to leave out: `max_query_len == 1` picks the decode kernel
    (without it, the decode kernel runs when T equals the number of sequences); `max_seq_len`
    bounds the context for choosing the decode split count (default: the block table's width).
    """
    if use_triton(q):
        from .triton_attention import paged_attention_triton
        return paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                      scale, max_query_len=max_query_len, max_seq_len=max_seq_len,
                                      kv_scales=kv_scales)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, kv_scales)


# Rows up to which rotary_decode_attention fuses rotary and the cache write into the attention
# kernel. `benchmarks/kernels_bench.py --only decode` (H200, 2026-11-29), per layer: fused 6.1 us
# against 7.6 for the rotary kernel + attention at batch 1 (context 192), 20.2 against 22.3 at 64;
# but 77.8 against 65.2 at 256, and 34.2 against 32.8 at 16 rows of 1,024-token context.
FUSED_ROTARY_MAX_ROWS = 64


def rotary_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            cos_sin: torch.Tensor, rotary_dim: int, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                            seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                            max_seq_len: int | None = None, kv_scales: KVScales = NO_SCALES) -> torch.Tensor:
    """A decode step's attention from its unrotated q, k, v [T, heads, hd] (one query row per
    sequence): rotary, the cache write and attention. On the GPU, up to FUSED_ROTARY_MAX_ROWS rows,
    that is one kernel (the rotary kernel's launch is gone from every layer) unless the decode
    config for these rows and heads says FUSE_ROTARY False (wide heads); otherwise it is the
    rotary kernel (or reference) and then attention. Slots < 0 are skipped on the GPU (padding
    rows of a captured batch)."""
    if use_triton(q) and q.shape[0] <= FUSED_ROTARY_MAX_ROWS:
        from .triton_attention import decode_config_for, max_context, paged_attention_triton
        cfg = decode_config_for(q.shape[0], q.shape[-1], k_cache.dtype,
                                max_context(max_seq_len, block_tables, k_cache.shape[1]))
        if cfg.get("FUSE_ROTARY", True):
            return paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                          max_query_len=1, max_seq_len=max_seq_len, decode_config=cfg,
                                          rotary=(k, v, positions, cos_sin, rotary_dim, slot_mapping),
                                          kv_scales=kv_scales)
    from .rotary import apply_rotary_and_write_kv
    q = apply_rotary_and_write_kv(q, k, v, positions, cos_sin, rotary_dim, k_cache, v_cache, slot_mapping,
                                  kv_scales)
    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len=1,
                           max_seq_len=max_seq_len, kv_scales=kv_scales)
