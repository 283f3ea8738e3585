"""Pinned staging and the packed step layout that CUDA graphs read (run here on CPU tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardline.kernels.embedding import resolve_ids
from shardline.kernels.step_io import give_ref, take_ref
from shardline.stage_worker.cuda_graphs import StepLayout
from shardline.stage_worker.staging import DeferredTokens, HostStep, IdRing, PinnedStaging, TokenReadback


def test_layout_round_trips_a_step_and_pads_the_rest():
    step = HostStep(positions=[5, 17, 2], slots=[37, 81, 2], tables=[[4, 2], [9, 3, 5], [0]],
                    seq_lens=[6, 18, 3], max_query_len=1, max_seq_len=18)
    b, ctx, block_size = 4, 40, 8
    layout = StepLayout(b, -(-ctx // block_size))
    staging = PinnedStaging(layout.numel, torch.device("cpu"))
    buffer = torch.full((layout.numel + 7,), 99, dtype=torch.int64)
    slot, buf = staging.slot()
    buf[:] = 12345  # stale contents of a reused slot must not leak into the step
    layout.fill(buf, step, np.array([11, 12, 0]), pending=[(2, 5)])
    staging.upload(slot, layout.numel, buffer)
    ids, src, meta = layout.views(buffer, torch.arange(b + 1, dtype=torch.int32), torch.arange(b), ctx)
    assert ids.tolist() == [11, 12, 0, 0]
    assert src.tolist() == [-1, -1, 5, -1], "row 2 takes the previous step's 6th sampled id; the rest their own"
    assert meta.positions.tolist() == [5, 17, 2, 0]
    assert meta.slot_mapping.tolist() == [37, 81, 2, -1]  # padding rows write nowhere
    assert meta.seq_lens.dtype == torch.int32 and meta.seq_lens.tolist() == [6, 18, 3, 1]
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.shape == (4, 5)
    tables = meta.block_tables.tolist()
    assert tables[0][:2] == [4, 2] and tables[1][:3] == [9, 3, 5] and tables[2][:1] == [0]
    assert tables[3][0] == 0  # a padding row reads block 0
    assert meta.logits_wanted.tolist() == [0], "an all-greedy step: the head may skip the logits"
    assert buffer[layout.numel:].tolist() == [99] * 7  # nothing written past the layout
    step.needs_logits = True
    slot, buf = staging.slot()
    layout.fill(buf, step, np.array([11, 12, 0]))
    staging.upload(slot, layout.numel, buffer)
    assert meta.logits_wanted.tolist() == [1], "a step that draws at a temperature reads the logits"


@pytest.mark.parametrize("b,width", [(1, 16), (3, 5), (256, 4096)])
def test_a_layouts_parts_are_disjoint_and_inside_it(b, width):
    """Every part a graph reads (ids, src, positions, slots, seq_lens, block table, the logits flag)
    has its own bytes,
    all within the layout's numel, so one upload of numel elements carries the whole step."""
    layout = StepLayout(b, width)
    buffer = torch.zeros(layout.numel + 64, dtype=torch.int64)
    ids, src, meta = layout.views(buffer, torch.arange(b + 1, dtype=torch.int32), torch.arange(b), 16 * width)
    parts = [ids, src, meta.positions, meta.slot_mapping, meta.seq_lens, meta.block_tables, meta.logits_wanted,
             buffer[layout.skip_at:layout.skip_at + 1], buffer[layout.ids_row_at:layout.ids_row_at + 1]]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in parts)
    start, end = buffer.data_ptr(), buffer.data_ptr() + layout.numel * 8
    assert spans[0][0] >= start and spans[-1][1] <= end, "a part lies outside the uploaded span"
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), "two parts overlap"
    assert meta.block_tables.shape == (b, width) and meta.seq_lens.shape == (b,)


def test_to_device_copies_values_and_grows_past_its_slot():
    staging = PinnedStaging(4, torch.device("cpu"))
    assert staging.to_device([3, 1, 2]).tolist() == [3, 1, 2]
    assert staging.to_device(list(range(10))).tolist() == list(range(10))  # larger than a slot
    first, second = staging.to_device([7]), staging.to_device([8])
    assert first.tolist() == [7] and second.tolist() == [8]  # each call has its own result


def test_a_graph_takes_pending_ids_from_the_previous_steps_sampled_ids():
    """What a one-stage decode graph feeds its model: the host id where src is -1, else the id the
    previous step sampled in row src (which may be any row of a larger previous batch)."""
    sampled = torch.tensor([70, 71, 72, 73, 74, 75])
    ids = torch.tensor([11, 0, 13, 0])
    src = torch.tensor([-1, 5, -1, 0])
    assert resolve_ids(ids, src, sampled).tolist() == [11, 75, 13, 70]


def test_a_graph_takes_the_mailbox_above_its_skip_word_and_gives_its_ids_to_the_named_row():
    """The graph's first and last kernels (shardline/kernels/step_io.py) through the layout: host ids taken
    with the rest of the step; a step whose ids are already on the device skips them; the ids go
    to the ring row the step names."""
    step = HostStep(positions=[5, 17], slots=[37, 81], tables=[[4, 2], [9, 3, 5]], seq_lens=[6, 18],
                    max_query_len=1, max_seq_len=18)
    layout = StepLayout(3, 5)
    mailbox = torch.zeros(layout.numel + 9, dtype=torch.int64)
    buffer = torch.full((layout.numel,), 99, dtype=torch.int64)
    layout.fill(mailbox.numpy(), step, np.array([11, 12]), ids_row=2)
    take_ref(mailbox, buffer, layout.skip_at)
    ids, _, meta = layout.views(buffer, torch.arange(4, dtype=torch.int32), torch.arange(3), 40)
    assert ids.tolist() == [11, 12, 0] and meta.positions.tolist() == [5, 17, 0]
    buffer[:2] = torch.tensor([41, 42])  # a TP follower's ids, broadcast on the device
    layout.fill(mailbox.numpy(), step, skip=3, ids_row=1)
    take_ref(mailbox, buffer, layout.skip_at)
    assert ids.tolist() == [41, 42, 0], "the device's ids stay"
    assert meta.slot_mapping.tolist() == [37, 81, -1]
    ring = torch.zeros(4, 3, dtype=torch.int64)
    give_ref(torch.tensor([7, 8, 9]), buffer, layout.ids_row_at, ring)
    assert ring[1].tolist() == [7, 8, 9] and ring[[0, 2, 3]].abs().sum() == 0


class FakeEvent:
    """Stands in for a CUDA event (the GPU's completion is not what this is about): counts waits."""

    def __init__(self) -> None:
        self.waits = 0

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        self.waits += 1


def test_a_ring_row_goes_to_a_new_step_only_once_the_last_holder_has_its_own_copy():
    ring = IdRing(2, 4, torch.device("cpu"))
    ring._events = [FakeEvent(), FakeEvent()]
    first = ring.claim()
    ring.host[first, :3] = torch.tensor([1, 2, 3])
    held = ring.deferred(first, 3)
    second = ring.claim()
    assert second != first
    ring.deferred(second, 3).tolist()
    again = ring.claim()  # the first row again: its holder has not been read yet
    assert again == first and ring._events[first].waits == 1, "the holder waited for its step"
    ring.host[again, :3] = torch.tensor([7, 7, 7])  # the next step's ids land in the row
    assert held.tolist() == [1, 2, 3], "the first step's ids were kept before the row was reused"


def test_deferred_tokens_read_the_same_ids_twice_and_readback_copies_on_cpu():
    d = DeferredTokens(torch.tensor([4, 5]), FakeEvent())
    assert d.tolist() == [4, 5] and d.tolist() == [4, 5] and d.event is None
    ids = torch.tensor([9, 8, 7])
    got = TokenReadback(4, torch.device("cpu")).start(ids)
    ids[0] = 0
    assert got.tolist() == [9, 8, 7], "the readback holds its own copy"
