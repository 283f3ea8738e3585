"""Rotary position embedding in rotate-half (NeoX) layout over the first `rotary_dim` dims.

The converter stores GPT-J's interleaved q/k rows permuted into this layout, so this one path
serves Llama, Mistral, Qwen2 and GPT-J alike.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._dispatch import use_triton
from .attention import NO_SCALES, KVScales, write_kv_ref


def rotary_inv_freq(rotary_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope scaling type {kind!r} is not supported; supported: linear, llama3")


def rotary_cos_sin(max_positions: int, rotary_dim: int, theta: float,
                   scaling: dict[str, Any] | None, device: torch.device | str = "cpu") -> torch.Tensor:
    """Table [max_positions, rotary_dim]: cos of the rotary_dim/2 frequencies, then their sin (fp32)."""
    inv_freq = rotary_inv_freq(rotary_dim, theta, scaling)
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (P, rd/2)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)


def apply_rotary_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin: torch.Tensor, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, nh, hd], k [T, nkv, hd], positions [T] -> rotated (q, k), new tensors."""
    half = rotary_dim // 2
    cs = cos_sin[positions]  # (T, rd)
    cos = torch.cat([cs[:, :half], cs[:, :half]], dim=-1)[:, None, :]  # (T, 1, rd)
    sin = torch.cat([cs[:, half:], cs[:, half:]], dim=-1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = torch.cat([-x2, x1], dim=-1)
        out = (rot * cos.to(x.dtype)) + (rotated * sin.to(x.dtype))
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out

    return rotate(q), rotate(k)


def apply_rotary_and_write_kv_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  positions: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int,
                                  k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  slot_mapping: torch.Tensor, kv_scales: KVScales = NO_SCALES) -> torch.Tensor:
    """Rotate q and k, write the rotated k and v into their cache slots; returns the rotated q."""
    q, k = apply_rotary_ref(q, k, positions, cos_sin, rotary_dim)
    write_kv_ref(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return q


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin: torch.Tensor, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(q):
        from .triton_rotary import apply_rotary_triton
        return apply_rotary_triton(q, k, positions, cos_sin, rotary_dim)
    return apply_rotary_ref(q, k, positions, cos_sin, rotary_dim)


def apply_rotary_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              positions: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int,
                              k_cache: torch.Tensor, v_cache: torch.Tensor,
                              slot_mapping: torch.Tensor, kv_scales: KVScales = NO_SCALES) -> torch.Tensor:
    """One kernel on the GPU: the rotated k goes straight to the cache. Slots < 0 are skipped there
    (padding rows of a captured batch); the reference requires every slot to be valid."""
    if use_triton(q):
        from .triton_rotary import apply_rotary_and_write_kv_triton
        return apply_rotary_and_write_kv_triton(q, k, v, positions, cos_sin, rotary_dim,
                                                k_cache, v_cache, slot_mapping, kv_scales)
    return apply_rotary_and_write_kv_ref(q, k, v, positions, cos_sin, rotary_dim,
                                         k_cache, v_cache, slot_mapping, kv_scales)
