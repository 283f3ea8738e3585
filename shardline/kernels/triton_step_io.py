"""Triton kernels of step_io.py. Imported only when a CUDA (or interpreted) tensor arrives."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import pdl_args
from .triton_pdl import pdl_wait

BLOCK = 1024


@triton.jit
def _take_kernel(mailbox_ptr, buffer_ptr, n, skip_at, BLOCK: tl.constexpr):
    # A graph's first kernel: nothing ahead of it in the graph to wait for.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    skip = tl.load(mailbox_ptr + skip_at)  # beside the words below, not before them
    words = tl.load(mailbox_ptr + offs, mask=offs < n)
    tl.store(buffer_ptr + offs, words, mask=(offs < n) & (offs >= skip))


@triton.jit
def _give_kernel(ids_ptr, buffer_ptr, slot_at, ring_ptr, stride_ring, n, BLOCK: tl.constexpr,
                 USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)  # the ids are the kernel ahead's
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(buffer_ptr + slot_at)
    ids = tl.load(ids_ptr + offs, mask=offs < n)
    tl.store(ring_ptr + slot * stride_ring + offs, ids, mask=offs < n)


def take_triton(mailbox: torch.Tensor, buffer: torch.Tensor, skip_at: int) -> None:
    n = buffer.numel()
    _take_kernel[(triton.cdiv(n, BLOCK),)](mailbox, buffer, n, skip_at, BLOCK=BLOCK, num_warps=4)


def give_triton(ids: torch.Tensor, buffer: torch.Tensor, slot_at: int, ring: torch.Tensor) -> None:
    n = ids.numel()
    _give_kernel[(triton.cdiv(n, BLOCK),)](ids, buffer, slot_at, ring, ring.stride(0), n, BLOCK=BLOCK, num_warps=4,
                                           **pdl_args(ids))
