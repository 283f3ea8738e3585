"""The step's first kernel (kernels/embedding.py): pending ids resolved from the previous step's
sampled ids, the embedding rows copied exactly, and each row's sum of squares as RowNorm takes it."""

from __future__ import annotations

import pytest
import torch

from shardline.kernels.embedding import embed_rows, embed_rows_ref
from shardline.kernels.norm import RowNorm


def _case(T: int, V: int, H: int, device: str, dtype=torch.bfloat16):
    weight = torch.randn(V, H, dtype=dtype, device=device)
    ids = torch.randint(0, V, (T,), device=device)
    sampled = torch.randint(0, V, (max(T, 3),), device=device)
    src = torch.full((T,), -1, dtype=torch.int64, device=device)
    src[::2] = torch.arange(0, T, 2, device=device) % sampled.numel()  # every other row pending
    return ids, weight, src, sampled


def test_reference_against_a_row_by_row_lookup():
    ids, weight, src, sampled = _case(7, 50, 12, "cpu", torch.float32)
    x, ss = embed_rows_ref(ids, weight, src, sampled, sum_squares=True)
    for r in range(7):
        token = int(sampled[src[r]]) if src[r] >= 0 else int(ids[r])
        assert torch.equal(x[r], weight[token])
        assert ss[0, r].item() == pytest.approx(float((weight[token].double() ** 2).sum()), rel=1e-6)
    assert ss.shape == (1, 7) and ss.dtype == torch.float32
    assert RowNorm(ss, 1e-5).rstd(12).shape == (7,)


def test_src_without_sampled_is_an_error():
    ids, weight, src, _ = _case(3, 10, 8, "cpu")
    with pytest.raises(ValueError, match="src and sampled go together"):
        embed_rows(ids, weight, src=src)


@pytest.mark.gpu
@pytest.mark.parametrize("T,V,H", [(1, 128, 4096), (64, 1000, 4096), (5, 77, 100), (9, 300, 5000)])
@pytest.mark.parametrize("pending", [False, True])
def test_triton_matches_reference(device, T, V, H, pending):
    ids, weight, src, sampled = _case(T, V, H, device)
    if not pending:
        src = sampled = None
    got, ss = embed_rows(ids, weight, src, sampled, sum_squares=True)
    want, want_ss = embed_rows_ref(ids, weight, src, sampled, sum_squares=True)
    assert torch.equal(got, want)  # a copy: bit for bit
    torch.testing.assert_close(ss, want_ss, rtol=1e-5, atol=1e-3)
    plain, none = embed_rows(ids, weight, src, sampled)
    assert none is None and torch.equal(plain, want)
