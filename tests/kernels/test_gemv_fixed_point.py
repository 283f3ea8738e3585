"""The bulk GEMV's int8 product by dp4a (kernels/cuda_gemv.py, XQ), emulated on the CPU: x's chunk
as 16-bit fixed point under a power-of-two scale, split into a signed high and an unsigned low
byte plane, and the 8 dp4a of `dot16_fixed`. The steps mirror `to_fixed16` bit for bit; the GPU
tests (test_gemv.py) check the kernel itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def to_fixed16(f: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(high bytes as int8, low bytes as uint8, scale) of a 16-value chunk, as the kernel makes them."""
    m = np.float32(np.abs(f).max())
    E = max(-100, int((m.view(np.uint32) >> 23) & 0xFF) - 126)  # m < 2^E
    up = np.uint32((127 + 15 - E) << 23).view(np.float32)
    v = (f.astype(np.float32) * up + np.float32(12582912.0)).view(np.int32) - 0x4B400000  # up is a power of two
    q = np.clip(v, -32767, 32767)
    return (q >> 8).astype(np.int8), (q & 0xFF).astype(np.uint8), float(np.uint32((127 - 15 + E) << 23).view(np.float32))


def dot16_fixed(w: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> int:
    """The kernel's 8 dp4a: the high bytes' sum, shifted 8 left, then the low bytes' (int32 throughout)."""
    acc = np.int32(0)
    for i in range(4):
        acc = np.int32(acc + np.dot(w[4 * i:4 * i + 4].astype(np.int32), hi[4 * i:4 * i + 4].astype(np.int32)))
    acc = np.int32(acc << 8)
    for i in range(4):
        acc = np.int32(acc + np.dot(w[4 * i:4 * i + 4].astype(np.int32), lo[4 * i:4 * i + 4].astype(np.int32)))
    return int(acc)


def bf16_values(rng: np.random.Generator, n: int, spread: float) -> np.ndarray:
    """n values exactly representable in bf16, of random signs, magnitudes within [1, 2^spread)."""
    v = rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(0, spread, n))
    return torch.tensor(v, dtype=torch.float32).to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("seed", range(20))
def test_a_chunk_within_2_to_the_7_is_exact(seed):
    """bf16 values have 8 significant bits: a chunk spanning under 2^7 fits 16-bit fixed point exactly."""
    rng = np.random.default_rng(seed)
    x = bf16_values(rng, 16, 6.0) * np.float32(2.0 ** rng.integers(-30, 30))
    w = rng.integers(-127, 128, 16).astype(np.int8)
    hi, lo, scale = to_fixed16(x)
    np.testing.assert_array_equal(hi.astype(np.int64) * 256 + lo, x.astype(np.float64) / scale)
    assert dot16_fixed(w, hi, lo) * scale == np.dot(w.astype(np.float64), x.astype(np.float64))


@pytest.mark.parametrize("seed", range(20))
def test_a_wide_chunk_is_off_by_under_2_to_the_minus_15_of_its_largest(seed):
    rng = np.random.default_rng(100 + seed)
    x = bf16_values(rng, 16, 20.0)
    x[rng.integers(16)] = -np.abs(x).max() * 1.9999  # the largest negative, near the next power of two
    w = np.full(16, -127, dtype=np.int8)  # the widest dot product: the int32 sums must not overflow
    hi, lo, scale = to_fixed16(x)
    err = np.abs((hi.astype(np.int64) * 256 + lo) * scale - x)
    assert err.max() < np.abs(x).max() * 2.0 ** -15  # half the unit, 2^(E - 16), and the largest is >= 2^(E - 1)
    exact = np.dot(w.astype(np.float64), x.astype(np.float64))
    assert abs(dot16_fixed(w, hi, lo) * scale - exact) <= 16 * 127 * np.abs(x).max() * 2.0 ** -15


def test_zero_and_tiny_chunks():
    hi, lo, scale = to_fixed16(np.zeros(16, dtype=np.float32))
    assert not hi.any() and not lo.any() and scale > 0
    tiny = np.full(16, 1e-38, dtype=np.float32)  # exponent clamped: the scales stay normal floats
    hi, lo, scale = to_fixed16(tiny)
    assert np.isfinite(scale) and scale > 0
