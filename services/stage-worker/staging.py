"""A step's host data on its way to the GPU, and its sampled ids on their way back, without
waiting for the GPU. `HostStep` is a step's layout as plain lists; `PinnedStaging` sends host data
up; `TokenReadback` brings sampled ids down into an `IdRing`, the rows of pinned memory that a
decode graph also writes its ids to itself (cuda_graphs.py, which takes its inputs from a pinned
mailbox the same way).

A copy from pageable host memory waits for every kernel already queued on the stream before it
starts (CUDA's rule for pageable transfers): one `torch.tensor(...).to("cuda")` while step N runs
stalls the host until step N ends, which is what kept overlapped decode from overlapping. Pinned
memory copies asynchronously, but allocating it each step costs more than it saves. So each
user of host data owns a `PinnedStaging`: pinned host slots allocated once, filled through
numpy, and sent with one copy. Slots rotate; a slot is reused only after its last copy has run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from shardline.model.transformer import StepMetadata


class PinnedStaging:
    def __init__(self, numel: int, device: torch.device, dtype: torch.dtype = torch.int64, slots: int = 2) -> None:
        self.device, self.numel = device, numel
        on_gpu = device.type == "cuda"
        self.host = torch.zeros(slots, numel, dtype=dtype, pin_memory=on_gpu)
        self.host_np = self.host.numpy()
        self.events = [torch.cuda.Event() if on_gpu else None for _ in range(slots)]
        self._used = [False] * slots
        self._next = 0

    def slot(self) -> tuple[int, np.ndarray]:
        """The next host slot to fill (waits, if ever needed, until its previous copy has run)."""
        i = self._next
        self._next = (i + 1) % len(self.events)
        if self._used[i] and self.events[i] is not None:
            self.events[i].synchronize()
        return i, self.host_np[i]

    def upload(self, slot: int, n: int, out: torch.Tensor) -> torch.Tensor:
        """Copy host slot[:n] into the flat device tensor out[:n] (queued on the current stream)."""
        dst = out[:n]
        dst.copy_(self.host[slot, :n], non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        self._used[slot] = True
        return dst

    def to_device(self, values: list[int] | np.ndarray) -> torch.Tensor:
        """A fresh device tensor holding `values` (one copy, no wait)."""
        n = len(values)
        if n > self.numel:  # larger than planned for: a one-off pinned copy
            t = torch.as_tensor(np.asarray(values), dtype=self.host.dtype)
            return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t
        slot, buf = self.slot()
        buf[:n] = values
        return self.upload(slot, n, torch.empty(n, dtype=self.host.dtype, device=self.device))


@dataclass
class HostStep:
    """One step's layout on the host, built by `StageEngine._prepare`: plain lists, so the graph
    path packs them into its pinned staging buffer and the eager path makes tensors of them."""

    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=lambda: [0])
    sample_rows: list[int] = field(default_factory=list)
    max_query_len: int = 0
    max_seq_len: int = 0
    # Whether anything reads the step's logits (a row drawn at a temperature, or logits returned).
    # A decode graph's head skips writing them when not (cuda_graphs.py); the eager path always does.
    needs_logits: bool = False

    def metadata(self) -> StepMetadata:
        """Host tensors (plain pageable memory: this is the eager path, where prefill dominates)."""
        width = max(len(t) for t in self.tables)
        return StepMetadata(
            positions=torch.tensor(self.positions, dtype=torch.int64),
            slot_mapping=torch.tensor(self.slots, dtype=torch.int64),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in self.tables], dtype=torch.int32),
            seq_lens=torch.tensor(self.seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(self.starts, dtype=torch.int32),
            sample_rows=torch.tensor(self.sample_rows, dtype=torch.int64),
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
        )


@dataclass
class DeferredTokens:
    """A step's sampled ids, on their way to the host: `tolist()` waits for this step only. Only
    the host copy is kept: the device ids may sit in a buffer that the next step overwrites."""

    host: torch.Tensor
    event: torch.cuda.Event | None = None

    def tolist(self) -> list[int]:
        self.settle()
        return self.host.tolist()

    def settle(self) -> None:
        """Wait for the step, then hold the ids in memory of its own (its ring row may be reused)."""
        if self.event is not None:
            self.event.synchronize()
            self.host, self.event = self.host.clone(), None


class IdRing:
    """Rows of pinned host memory that steps' sampled ids land in: by a copy (TokenReadback) or by
    a decode graph's last kernel (cuda_graphs.py). A row goes to a new step only once the
    DeferredTokens that held it has settled, so ids are never overwritten unread; with more rows
    than steps in flight that never waits."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        on_gpu = device.type == "cuda"
        self.host = torch.zeros(rows, width, dtype=torch.int64, pin_memory=on_gpu)
        self._events = [torch.cuda.Event() if on_gpu else None for _ in range(rows)]
        self._holders: list[DeferredTokens | None] = [None] * rows
        self._next = 0

    def claim(self) -> int:
        """The next row, free of the step that held it."""
        i = self._next
        self._next = (i + 1) % len(self._holders)
        if self._holders[i] is not None:
            self._holders[i].settle()
            self._holders[i] = None
        return i

    def deferred(self, row: int, n: int) -> DeferredTokens:
        """Row `row`'s first n ids, once the work queued on the current stream so far is done."""
        event = self._events[row]
        if event is not None:
            event.record()
        self._holders[row] = DeferredTokens(self.host[row, :n], event)
        return self._holders[row]


class TokenReadback:
    """Copies each step's sampled ids to pinned host memory right after the sampler, before the
    next step is queued. A plain `ids.tolist()` made later would wait behind that next step as
    well (a device-to-host copy waits for everything queued on the stream before it), which
    serialises overlapped decode again; and it would read the ids after the next step had
    overwritten them (cuda_graphs.py's `sampled`). A decode graph's greedy ids skip it: the graph
    writes them to host memory itself."""

    def __init__(self, capacity: int, device: torch.device, slots: int = 4) -> None:
        self.on_gpu = device.type == "cuda"
        self.ring = IdRing(slots, capacity, device)

    def start(self, ids: torch.Tensor) -> DeferredTokens:
        if not self.on_gpu:
            return DeferredTokens(ids.clone())  # its own copy, as on a GPU
        if ids.numel() > self.ring.host.shape[1]:  # more than a step samples (max_num_seqs): copy now
            return DeferredTokens(ids.cpu())
        row = self.ring.claim()
        self.ring.host[row, :ids.numel()].copy_(ids, non_blocking=True)
        return self.ring.deferred(row, ids.numel())
