"""A decode graph's own I/O (kernels/step_io.py): the step taken from the host mailbox from its
skip word on, and the sampled ids written to the ring row the step names."""

from __future__ import annotations

import pytest
import torch

from shardline.kernels.step_io import give, give_ref, take, take_ref


def _mailbox(n: int, skip_at: int, skip: int) -> torch.Tensor:
    mailbox = torch.arange(1000, 1000 + n + 5, dtype=torch.int64)  # longer than the buffer
    mailbox[skip_at] = skip
    return mailbox


@pytest.mark.parametrize("skip", [0, 3])
def test_take_reference_copies_from_the_skip_word_on(skip):
    n, skip_at = 12, 10
    mailbox, buffer = _mailbox(n, skip_at, skip), torch.full((n,), -7, dtype=torch.int64)
    take_ref(mailbox, buffer, skip_at)
    assert buffer[:skip].tolist() == [-7] * skip, "the words below skip stay as the device left them"
    assert buffer[skip:].tolist() == mailbox[skip:n].tolist()


def test_give_reference_writes_the_named_row_only():
    ring = torch.zeros(4, 6, dtype=torch.int64)
    buffer = torch.tensor([0, 0, 2], dtype=torch.int64)
    give_ref(torch.tensor([5, 6, 7]), buffer, 2, ring)
    assert ring[2].tolist() == [5, 6, 7, 0, 0, 0] and ring[[0, 1, 3]].abs().sum() == 0


def test_bad_shapes_name_the_problem():
    with pytest.raises(ValueError, match="the buffer must fit the mailbox"):
        take(torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="must fit a row"):
        give(torch.zeros(9, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 1, torch.zeros(2, 8, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("n,skip", [(1, 0), (801, 0), (801, 64), (5000, 17)])
def test_triton_take_matches_the_reference_from_pinned_memory(device, n, skip):
    skip_at = n - 1 if n > 1 else 0
    mailbox = _mailbox(n, skip_at, skip if n > 1 else 0)
    if device == "cuda":
        mailbox = mailbox.pin_memory()  # read by the kernel over PCIe
    got = torch.full((n,), -7, dtype=torch.int64, device=device)
    want = got.cpu().clone()
    take(mailbox, got, skip_at)
    take_ref(mailbox, want, skip_at)
    assert got.cpu().tolist() == want.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("n,row", [(1, 0), (64, 3), (257, 1)])
def test_triton_give_matches_the_reference_into_pinned_memory(device, n, row):
    ids = torch.randint(0, 128256, (n,), device=device)
    buffer = torch.tensor([9, row], dtype=torch.int64, device=device)
    ring = torch.zeros(4, 300, dtype=torch.int64)
    if device == "cuda":
        ring = ring.pin_memory()  # written by the kernel over PCIe
    want = ring.clone()
    give(ids, buffer, 1, ring)
    if device == "cuda":
        torch.cuda.synchronize()
    give_ref(ids.cpu(), buffer.cpu(), 1, want)
    assert torch.equal(ring, want)
