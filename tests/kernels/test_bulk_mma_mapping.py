"""The bulk GEMV's tensor-core mapping (kernels/cuda_gemv.py, BULK and MMA), emulated in float64 on
the CPU: stage rows x 16 / rows segments of K as the 16 A rows of mma.m16n8k16, each lane's chunk
(`lane_chunk`), the fragments' documented layout, the diagonal of D and the sum over segments.
The formulas mirror the kernel's line for line, and the chunk count per lane is `bulk_tiles`'s
CPL; the GPU tests (test_gemv.py) check the kernel itself."""

from __future__ import annotations

import numpy as np
import pytest

from shardline.kernels import cuda_gemv


def _stage_sums(rows: int, chunks: int, warps: int, epc: int, cpl: int) -> tuple[np.ndarray, np.ndarray]:
    """(what the emulated warps leave as the rows' partial sums, W @ x) for one stage."""
    segs = 16 // max(2, 1 << (rows - 1).bit_length())
    seg = -(-chunks // segs)
    steps = -(-seg // 4)
    rng = np.random.default_rng(rows * 1000 + chunks)
    w = rng.integers(-3, 4, (rows, chunks, epc)).astype(float)
    x = rng.integers(-3, 4, (chunks, epc)).astype(float)

    def lane_chunk(i: int, lane: int, warp: int) -> int:
        step, sg = warp + warps * i, (lane >> 2) % segs
        if step >= steps:
            return -1
        c = 4 * ((step + (sg & 1)) % steps) + (lane & 3)
        return sg * seg + c if c < min(seg, chunks - sg * seg) else -1

    owners = [lane_chunk(i, lane, v) for v in range(warps) for i in range(cpl) for lane in range(4 * segs)]
    assert sorted(c for c in owners if c >= 0) == list(range(chunks)), "x's chunks, each held once as B"
    total = np.zeros(rows)
    for v in range(warps):
        d = np.zeros((32, 4))  # each lane's accumulator fragment
        for j in range(cpl):
            if v + warps * j >= steps:
                break
            a, b = np.zeros((16, 4 * epc)), np.zeros((4 * epc, 8))  # k: lane t's epc values
            for lane in range(32):
                g, t, c = lane >> 2, lane & 3, lane_chunk(j, lane, v)
                for m, r in ((g, g // segs), (g + 8, (g + 8) // segs)):
                    if c >= 0 and r < rows:
                        a[m, t * epc:(t + 1) * epc] = w[r, c]
                if c >= 0:
                    b[t * epc:(t + 1) * epc, g] = x[c]
            prod = a @ b
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                d[lane] += (prod[g, 2 * t], prod[g, 2 * t + 1], prod[g + 8, 2 * t], prod[g + 8, 2 * t + 1])
        acc = np.zeros((32, 2))
        for lane in range(32):
            g = lane >> 2
            sg = g % segs
            src = d[4 * g + (sg >> 1)]
            acc[lane] = (src[sg & 1], src[2 + (sg & 1)])
        off = 4
        while off < 4 * segs:
            acc = acc + acc[[lane ^ off for lane in range(32)]]
            off <<= 1
        for lane in range(0, 32, 4):
            g = lane >> 2
            if g % segs == 0:
                for k, r in ((0, g // segs), (1, (g + 8) // segs)):
                    if r < rows:
                        total[r] += acc[lane, k]
    return total, np.einsum("rce,ce->r", w, x)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("K,w_bytes", [(112, 2), (1040, 2), (1040, 1), (4096, 1), (7168, 1)])
@pytest.mark.parametrize("warps", [1, 3, 8])
def test_the_segments_and_the_diagonal_give_every_row_its_dot_product(rows, K, w_bytes, warps):
    glu = rows % 2 == 0 and rows > 8  # 12 and 16 rows: 6 and 8 gate rows with their up rows
    tiles = cuda_gemv.bulk_tiles(K, w_bytes, glu, dict(cuda_gemv.BULK_CONFIG, MMA=1, WARPS=warps,
                                                         ROWS=rows // 2 if glu else rows, STAGES=1))
    got, want = _stage_sums(rows, K * w_bytes // 16, warps, 16 // w_bytes, tiles["CPL"])
    np.testing.assert_array_equal(got, want)
