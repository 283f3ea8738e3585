"""The sampler: one token id per row of logits, for each row's SamplingParams.

Randomness is a pure function of (seed, position, token id): a counter-based hash turns each into
a uniform number, and sampling is the exponential race argmax(p / -log u) — exactly a draw from p.
No generator state exists, so a request resumed on another replica (prompt + tokens so far
recomputed) draws exactly what it would have drawn, and a sequence's draw never depends on which
other sequences share its batch.
"""

from __future__ import annotations

import torch

from shardline.kernels.argmax import argmax_rows
from shardline.sampling import SamplingParams

_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser on int64 tensors holding 32-bit values (products wrap; low bits exact)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """u in (0, 1) of shape [B, vocab], a function of (seed, position, token id) only."""
    device = seeds.device
    s = _hash32(seeds.long() ^ 0x9E3779B9)
    p = _hash32(positions.long() * 0x27D4EB2F + s)  # (B,)
    idx = torch.arange(vocab, device=device, dtype=torch.int64)
    h = _hash32(p[:, None] * 0x165667B1 + idx[None, :] + (s[:, None] << 1))  # (B, V)
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: torch.Tensor,
           greedy: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] (fp32), one SamplingParams per row, positions [B] = index of the token drawn.

    Returns token ids [B]. Greedy rows take argmax (first max on ties, as HF does); `greedy` [B],
    when given, is that argmax already computed (a decode graph's), and is returned as it is
    when every row is greedy.
    """
    if greedy is None:
        greedy = argmax_rows(logits)
    if all(p.is_greedy for p in params):
        return greedy
    # Every per-row parameter in one host tensor and one copy (pinned on a GPU, so the copy does
    # not wait for the kernels queued before it: see stage_worker/staging.py).
    device = logits.device
    vocab = logits.shape[-1]
    rows = torch.tensor([[p.temperature if not p.is_greedy else 1.0 for p in params],
                         [p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                         [p.top_p for p in params], [float(p.is_greedy) for p in params]], dtype=torch.float64)
    ints = torch.stack([torch.tensor([p.seed for p in params], dtype=torch.int64), positions.cpu().long()])
    if device.type == "cuda":
        rows, ints = rows.pin_memory(), ints.pin_memory()
    rows, ints = rows.to(device, non_blocking=True), ints.to(device, non_blocking=True)
    temps, k_t, p_t, is_greedy = rows[0].float(), rows[1].long(), rows[2].float()[:, None], rows[3] > 0
    seeds, positions = ints[0], ints[1]
    x = logits.float() / temps[:, None]
    if any(0 < p.top_k < vocab for p in params):
        sorted_desc = x.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(1, (k_t - 1)[:, None])  # (B, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.top_p < 1.0 for p in params):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it is kept).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= p_t
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    u = uniform_noise(seeds, positions, vocab)
    drawn = argmax_rows(probs / -torch.log(u))
    return torch.where(is_greedy, greedy, drawn)
