"""read_floor's walk probes (benchmarks/read_floor.py) read every byte once: a walk that skipped or
repeated tiles would time the wrong traffic. Each probe only adds up what it loads, so its
programs' sums must add up to the sum of the weights or of the KV cache it walks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the walk probes are Triton kernels (run on the GPU, or on the CPU "
                    "under TRITON_INTERPRET=1)")


def _small_ints(*shape, device):
    """bf16 values whose sums are exact in fp32 whatever the order of the adds."""
    return torch.randint(-3, 4, shape, device=device).to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("packed,per_sm,even", [(0, 0, False), (1, 0, False), (2, 0, False), (0, 1, False),
                                                (0, 1, True), (1, 1, True)])
def test_tile_walk_reads_every_weight_once(device, packed, per_sm, even):
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.read_floor import _tile_walk_kernel
    n, k, bn, bk = 320, 512, 64, 128
    w = _small_ints(n, k, device=device)
    if packed == 1:  # [bands, k-steps, bn, bk]
        w_view = w.view(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous().view(-1, bk)
    elif packed == 2:  # [k-steps, bands, bn, bk]
        w_view = w.view(n // bn, bn, k // bk, bk).permute(2, 0, 1, 3).contiguous().view(-1, bk)
    else:
        w_view = w
    bands = n // bn
    programs = 3 if per_sm else bands  # fewer programs than bands: persistent
    out = torch.zeros(programs, dtype=torch.float32, device=device)
    x = TensorDescriptor.from_tensor(torch.zeros(64, k, dtype=torch.bfloat16, device=device), [64, bk])
    _tile_walk_kernel[(programs, 1)](TensorDescriptor.from_tensor(w_view, [bn, bk]), x, out, k, bands, STAGES=2,
                                     SPLIT_K=1, WITH_X=False, PACKED=packed, ROTATE=False, EVEN=even)
    assert out.sum().item() == w.float().sum().item(), "the walk must read each weight tile exactly once"


@pytest.mark.gpu
@pytest.mark.parametrize("programs,even", [(None, False), (5, True), (7, True)])
def test_kv_walk_reads_each_rows_context_once(device, programs, even):
    from benchmarks.read_floor import _kv_walk_kernel
    rows, context, n_kv, hd, block_size, block_n = 3, 40, 2, 16, 16, 16
    n_blocks = -(-context // block_size)
    k = _small_ints(rows * n_blocks, block_size, n_kv, hd, device=device)
    v = _small_ints(rows * n_blocks, block_size, n_kv, hd, device=device)
    # Each row's blocks in reverse, so that a walk ignoring the block table reads the wrong tokens.
    bt = torch.arange(rows * n_blocks, dtype=torch.int32, device=device).view(rows, n_blocks).flip(1).contiguous()
    tokens = lambda c: c.view(rows, n_blocks, block_size, n_kv, hd).flip(1).reshape(rows, -1, n_kv, hd)[:, :context]
    want = tokens(k).float().sum() + tokens(v).float().sum()
    programs = programs or rows * n_kv
    out = torch.zeros(programs, dtype=torch.float32, device=device)
    _kv_walk_kernel[(programs,)](k, v, bt, out, context, rows, n_kv, bt.stride(0), k.stride(0), k.stride(1),
                                 BLOCK_N=block_n, BLOCK_SIZE=block_size, HEAD_DIM=hd, STAGES=2, EVEN=even)
    assert out.sum().item() == want.item(), "the walk must read each cached token of each row once"
