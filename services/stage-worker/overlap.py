"""One-stage decoding with the host one step ahead of the GPU.

Without overlap every step is: host builds the batch -> GPU runs it -> host waits for the tokens.
The host's share (scheduling, metadata, stop checks: ~0.3 ms at batch 1, ~3 ms at batch 256 in
Python) then adds to every step. Here step N+1 is launched before step N's tokens are read: its
rows whose input is a token still being sampled are passed to the engine as pending, (row, j) =
step N's j-th sampled id, which the step takes on the device (inside a decode graph, or gathered
before an eager step: engine.py), and the host reads step N's tokens while the GPU runs step N+1.

For an engine that is both first and last stage (PP = 1) with `EngineConfig.overlap_decode`;
the scheduler must have `lookahead=1`. With PP > 1 the micro-batches in flight already keep every
stage busy. Nothing on this path may wait for the device except the read of step N's tokens,
and that read must wait for step N alone (staging.py): host -> device copies go through pinned
staging (a pageable copy waits for the queued steps), and step N's tokens are copied to pinned
memory as soon as they are sampled (a later `.tolist()` would queue behind step N+1).
"""

from __future__ import annotations

from shardline.stage_worker.batch import StageBatch
from shardline.stage_worker.engine import StageEngine
from shardline.stage_worker.scheduler import Scheduler
from shardline.stage_worker.staging import DeferredTokens


def wants_overlap(engine: StageEngine) -> bool:
    return engine.config.overlap_decode and engine.is_first and engine.is_last


class OverlappedStepper:
    def __init__(self, engine: StageEngine, scheduler: Scheduler) -> None:
        assert engine.is_first and engine.is_last, "overlap needs the whole model in one stage"
        self.engine, self.scheduler = engine, scheduler
        self._launched: tuple[StageBatch, DeferredTokens] | None = None

    @property
    def has_launched(self) -> bool:
        return self._launched is not None

    def step(self, batch: StageBatch) -> tuple[StageBatch, list[int]] | None:
        """Launch `batch` (may be empty: then only its frees go to the engine), then return the
        previously launched batch and its tokens."""
        launched = None
        if batch.chunks:
            ids, pending = self.scheduler.input_ids(batch)
            if pending:  # the engine's previous step is the batch launched last
                index = {c.request_id: j for j, c in enumerate(self._launched[0].sampled)}
                pending = [(row, index[rid]) for row, rid in pending]
            launched = (batch, self.engine.step(batch, ids, defer_tokens=True, pending=pending))
        elif batch.free_request_ids:
            # Nothing to launch, but the scheduler hands the batch the sequences that finished
            # since the last one: a step would free their blocks first, so free them here (the
            # step in flight may still write their last lookahead token: it runs before any
            # later step that reuses the blocks, in stream order).
            self.engine.free(batch.free_request_ids)
        done, self._launched = self._launched, launched
        if done is None:
            return None
        return done[0], done[1].tolist()  # waits for step N only; step N+1 is already queued
