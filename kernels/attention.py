"""Attention over the paged KV cache, for ragged batches that mix prefill and decode.

Cache layout, per layer: k_cache and v_cache are [num_blocks, block_size, num_kv_heads, head_dim].
A token's slot is block_id * block_size + offset; `slot_mapping[t]` says where token t's k/v go.
The cache holds the model's dtype, or fp8 (e4m3, `--kv-cache-dtype fp8`): k and v are rounded to it
as they are written, saturating at +-448 with no scale, and widened to q's dtype as they are read.

Batch layout: the T query tokens of B sequences are packed back to back. Sequence b owns query
rows [query_start_loc[b], query_start_loc[b+1]) and, after this step, has seq_lens[b] tokens in
the cache (its queries are the last ones), whose blocks are block_tables[b, :]. Causality:
query j of a chunk of n tokens sits at position seq_len - n + j and sees keys [0, that position].
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton
from .quant import FP8_MAX


def as_cached(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to the cache's dtype; fp8 saturates at +-448 (the kernels' rounding too)."""
    if dtype == torch.float8_e4m3fn:
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """k, v [T, nkv, hd] -> cache slots (in place)."""
    nkv, hd = k.shape[1], k.shape[2]
    for x, cache in ((k, k_cache), (v, v_cache)):
        x = as_cached(x, cache.dtype)
        if cache.element_size() == 1:  # index_copy_ has no fp8 kernel: copy the bytes
            x, cache = x.view(torch.uint8), cache.view(torch.uint8)
        cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, x)


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, nh, hd] -> out [T, nh, hd]. One sequence at a time: the reference, not the fast path."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
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
        qb = q[q_lo:q_hi].transpose(0, 1).float()  # (nh, n, hd)
        scores = (qb @ k.transpose(1, 2)) * scale  # (nh, n, S)
        q_pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_lo:q_hi] = (probs @ v).transpose(0, 1).to(q.dtype)  # (n, nh, hd)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """On the GPU, slots < 0 are skipped (padding rows of a captured batch)."""
    if use_triton(k):
        from .triton_attention import write_kv_triton
        return write_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    return write_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, *,
                    max_query_len: int | None = None,
                    max_seq_len: int | None = None) -> torch.Tensor:
    """On the GPU: never reads device values on the host, so it can be captured in a CUDA graph.

    Optional host-side hints, both safe to leave out: `max_query_len == 1` picks the decode kernel
    (without it, the decode kernel runs when T equals the number of sequences); `max_seq_len`
    bounds the context for choosing the decode split count (default: the block table's width).
    """
    if use_triton(q):
        from .triton_attention import paged_attention_triton
        return paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                      scale, max_query_len=max_query_len, max_seq_len=max_seq_len)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


# Rows up to which rotary_decode_attention fuses rotary and the cache write into the attention
# kernel. `benchmarks/kernels_bench.py --only decode` (H200, 2026-11-29), per layer: fused 6.1 us
# against 7.6 for the rotary kernel + attention at batch 1 (context 192), 20.2 against 22.3 at 64;
# but 77.8 against 65.2 at 256, and 34.2 against 32.8 at 16 rows of 1,024-token context.
FUSED_ROTARY_MAX_ROWS = 64


def rotary_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            cos_sin: torch.Tensor, rotary_dim: int, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                            seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                            max_seq_len: int | None = None) -> torch.Tensor:
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
                                          rotary=(k, v, positions, cos_sin, rotary_dim, slot_mapping))
    from .rotary import apply_rotary_and_write_kv
    q = apply_rotary_and_write_kv(q, k, v, positions, cos_sin, rotary_dim, k_cache, v_cache, slot_mapping)
    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len=1,
                           max_seq_len=max_seq_len)
