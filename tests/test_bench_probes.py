"""The arithmetic of the GPU probes in benchmarks/, checked on CPU: the launch-cost line fit and
the tile packing the weight-layout probe indexes."""

from __future__ import annotations

import pytest
import torch


def test_launch_cost_fit_recovers_the_fixed_cost_and_the_rate():
    from benchmarks.launch_cost_bench import fit
    points = [(nbytes, 4.5 + nbytes / 4.2e6) for nbytes in (3e7, 6e7, 1.2e8, 2.4e8)]  # us, at 4,200 GB/s
    fixed, rate = fit(points)
    assert fixed == pytest.approx(4.5) and rate == pytest.approx(4200.0)


def test_weight_layout_pack_puts_tile_n_kb_at_its_rows():
    pytest.importorskip("triton", reason="the probe module defines its Triton kernel at import")
    from benchmarks.weight_layout_bench import pack
    bn, bk = 4, 8
    w = torch.arange(12 * 32, dtype=torch.float32).view(12, 32)
    packed = pack(w, bn, bk)
    kt = 32 // bk
    assert packed.shape == (12 * 32 // bk, bk)
    for n in range(12 // bn):
        for kb in range(kt):
            rows = slice((n * kt + kb) * bn, (n * kt + kb + 1) * bn)
            assert torch.equal(packed[rows], w[n * bn:(n + 1) * bn, kb * bk:(kb + 1) * bk])
