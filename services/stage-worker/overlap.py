"""One-stage decoding with the host one step ahead of the GPU.

Without overlap every step is: host builds the batch -> GPU runs it -> host waits for the tokens.
The host's share (scheduling, metadata, stop checks: ~0.3 ms at batch 1, ~3 ms at batch 256 in
Python) then adds to every step. Here step N+1 is launched before step N's tokens are read: its
rows whose input is a token still being sampled take it on the device from step N's output, and
the host reads step N's tokens while the GPU runs step N+1.

Opt-in (`EngineConfig.overlap_decode`) for an engine that is both first and last stage (PP = 1);
the scheduler must have `lookahead=1`. With PP > 1 the micro-batches in flight already keep every
stage busy. Measured on the H200 (docs/benchmarks.md) it has not yet paid: the host gap between
steps grew (0.28 -> 0.37 ms at batch 1) instead of vanishing, so something in this path still
waits for the device; until that is found it stays off by default.
"""

from __future__ import annotations

import torch

from shardline.stage_worker.batch import StageBatch
from shardline.stage_worker.engine import StageEngine
from shardline.stage_worker.scheduler import Scheduler


def wants_overlap(engine: StageEngine) -> bool:
    return engine.config.overlap_decode and engine.is_first and engine.is_last


class OverlappedStepper:
    def __init__(self, engine: StageEngine, scheduler: Scheduler) -> None:
        assert engine.is_first and engine.is_last, "overlap needs the whole model in one stage"
        self.engine, self.scheduler = engine, scheduler
        self._launched: tuple[StageBatch, torch.Tensor] | None = None

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device with an async copy (torch.tensor(..., device=cuda) is a synchronous copy
        that waits for the running step and undoes the overlap)."""
        return t.to(self.engine.device, non_blocking=True)

    @property
    def has_launched(self) -> bool:
        return self._launched is not None

    def step(self, batch: StageBatch) -> tuple[StageBatch, list[int]] | None:
        """Launch `batch` (may be empty), then return the previously launched batch and its tokens."""
        launched = None
        if batch.chunks:
            ids, pending = self.scheduler.input_ids(batch)
            inputs = self._to_device(ids)
            if pending:
                prev_batch, prev_tokens = self._launched
                index = {c.request_id: j for j, c in enumerate(prev_batch.sampled)}
                rows = self._to_device(torch.tensor([r for r, _ in pending]))
                src = self._to_device(torch.tensor([index[rid] for _, rid in pending]))
                inputs[rows] = prev_tokens[src]
            launched = (batch, self.engine.step(batch, inputs, defer_tokens=True))
        done, self._launched = self._launched, launched
        if done is None:
            return None
        return done[0], done[1].tolist()  # waits for step N only; step N+1 is already queued
