"""A decode graph's own input and output: kernels that read a step from pinned host memory and
write its sampled ids back to it, so that no copy engine stands between two replays.

A replayed step used to be three operations on the stream: the step's metadata copied up from a
pinned slot, the graph, the sampled ids copied down. Each copy is a round trip to a copy engine
between two graphs: the two cost a 64-row step 14-17 µs (7-11 µs up for 6.4 KB, 8.5-9.5 µs down
for 512 bytes), where these two kernels inside the graph cost nothing the replays resolve (H200,
`python -m benchmarks.graph_boundary`, docs/benchmarks.md "Between two steps"). Pinned host memory is mapped
into the GPU's address space (unified addressing), so a kernel reads and writes it over PCIe as
it does device memory.

- `take(mailbox, buffer, skip)`: buffer[skip:n] = mailbox[skip:n], n = buffer's length. `skip` is
  mailbox[skip_at], read beside the words (not before them: one PCIe round trip, not two); words
  below it stay as the host stream left them (a step whose token ids are already on the device).
- `give(ids, buffer, slot_at, ring)`: ring[buffer[slot_at], :len(ids)] = ids: the step names the
  row of the host ring its ids go to (staging.IdRing).

On the CPU (no graphs) and without Triton the references copy with torch.
"""

from __future__ import annotations

import torch

from ._dispatch import use_triton


def take_ref(mailbox: torch.Tensor, buffer: torch.Tensor, skip_at: int) -> None:
    skip = int(mailbox[skip_at])
    buffer[skip:] = mailbox[skip:buffer.numel()].to(buffer.device)


def give_ref(ids: torch.Tensor, buffer: torch.Tensor, slot_at: int, ring: torch.Tensor) -> None:
    ring[int(buffer[slot_at]), :ids.numel()] = ids.to(ring.device)


def take(mailbox: torch.Tensor, buffer: torch.Tensor, skip_at: int) -> None:
    """buffer[skip:] = mailbox[skip:len(buffer)], skip = mailbox[skip_at] (int64 words; the
    mailbox pinned host memory, the buffer on the device)."""
    if not (0 <= skip_at < buffer.numel() <= mailbox.numel()) or mailbox.dtype != buffer.dtype:
        raise ValueError(f"take: a mailbox of {mailbox.numel()} {mailbox.dtype} words into a buffer of "
                         f"{buffer.numel()} {buffer.dtype}, skip word {skip_at}: the buffer must fit the "
                         "mailbox, hold the skip word, and share its dtype")
    if use_triton(buffer):
        from .triton_step_io import take_triton
        return take_triton(mailbox, buffer, skip_at)
    return take_ref(mailbox, buffer, skip_at)


def give(ids: torch.Tensor, buffer: torch.Tensor, slot_at: int, ring: torch.Tensor) -> None:
    """ring[buffer[slot_at], :len(ids)] = ids (the ids and buffer on the device, the ring [rows,
    width] pinned host memory)."""
    if ids.numel() > ring.shape[1] or not 0 <= slot_at < buffer.numel():
        raise ValueError(f"give: {ids.numel()} ids into ring rows of {ring.shape[1]}, slot word {slot_at} of a "
                         f"{buffer.numel()}-word buffer: the ids must fit a row and the buffer hold the slot word")
    if use_triton(ids):
        from .triton_step_io import give_triton
        return give_triton(ids, buffer, slot_at, ring)
    return give_ref(ids, buffer, slot_at, ring)
