"""A step's host data on its way to the GPU, and its sampled ids on their way back, without
waiting for the GPU. `HostStep` is a step's layout as plain lists; `PinnedStaging` sends host data
up; `TokenReadback` brings sampled ids down.

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
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class TokenReadback:
    """Copies each step's sampled ids to pinned host memory right after the sampler, before the
    next step is queued. A plain `ids.tolist()` made later would wait behind that next step as
    well (a device-to-host copy waits for everything queued on the stream before it), which
    serialises overlapped decode again; and it would read the ids after the next step had
    overwritten them (cuda_graphs.py's `sampled`)."""

    def __init__(self, capacity: int, device: torch.device, slots: int = 4) -> None:
        self.on_gpu = device.type == "cuda"
        self.host = torch.zeros(slots, capacity, dtype=torch.int64, pin_memory=self.on_gpu)
        self.events = [torch.cuda.Event() if self.on_gpu else None for _ in range(slots)]
        self._next = 0

    def start(self, ids: torch.Tensor) -> DeferredTokens:
        if not self.on_gpu:
            return DeferredTokens(ids.clone())  # its own copy, as on a GPU
        if ids.numel() > self.host.shape[1]:  # more than a step samples (max_num_seqs): copy now
            return DeferredTokens(ids.cpu())
        i = self._next
        self._next = (i + 1) % len(self.events)
        self.events[i].synchronize()  # read long ago (slots > steps in flight); never waits in practice
        host = self.host[i, :ids.numel()]
        host.copy_(ids, non_blocking=True)
        self.events[i].record()
        return DeferredTokens(host, self.events[i])
