"""Stage 0's iteration-level (continuous) batching.

Each call to `schedule` builds the next micro-batch: sequences that are not already in the
pipeline each get a chunk — the rest of their prompt (capped by the step's token budget, so long
prompts are prefilled in chunks) or their one newest token. New sequences join at the next step,
finished ones leave at once. With PP stages, up to PP micro-batches are in flight; a sequence is
in at most one of them, since its next token depends on the last.

With `lookahead` = 1 (one stage on a GPU), a decoding sequence is scheduled again while its last
token is still being sampled: the engine reads that token on the device (see overlap.py), so the
host prepares step N+1 while the GPU runs step N. A sequence that turns out to have stopped
wastes one step's row, and its extra token is dropped.

Admission reserves KV blocks for a sequence's whole life (prompt + max_tokens), so a running
sequence never has to be preempted for room.
"""

from __future__ import annotations

from collections import deque

import torch

from shardline.stage_worker.batch import SequenceChunk, StageBatch
from shardline.stage_worker.sequence import FinishReason, Sequence, SequenceStatus


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, lookahead: int = 0) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.lookahead = lookahead
        self.waiting: deque[Sequence] = deque()
        self.running: dict[str, Sequence] = {}
        self.num_reserved_blocks = 0
        self._pending_free: list[str] = []

    @classmethod
    def for_engine(cls, engine, num_blocks: int | None = None, lookahead: int = 0) -> "Scheduler":
        """Stage 0's scheduler for `engine`'s limits (num_blocks: the smallest cache on the route)."""
        c = engine.config
        return cls(num_blocks or engine.block_manager.num_blocks, c.block_size, c.max_num_seqs,
                   c.max_num_batched_tokens, engine.max_model_len, lookahead)

    # -- admission --------------------------------------------------------------------------------

    def blocks_reserved_for(self, seq: Sequence) -> int:
        total = min(len(seq.prompt_token_ids) + seq.sampling.max_tokens + self.lookahead, self.max_model_len)
        return -(-total // self.block_size)

    def add(self, seq: Sequence) -> None:
        if self.blocks_reserved_for(seq) > self.num_blocks:
            raise ValueError(f"sequence {seq.request_id} needs {self.blocks_reserved_for(seq)} KV blocks "
                             f"but the cache holds {self.num_blocks}; shorten the prompt or max_tokens")
        self.waiting.append(seq)

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_reserved_blocks

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = self.blocks_reserved_for(seq)
            if need > self.num_free_blocks:
                break
            self.waiting.popleft()
            self.num_reserved_blocks += need
            seq.status = SequenceStatus.RUNNING
            self.running[seq.request_id] = seq

    # -- one step ---------------------------------------------------------------------------------

    def schedule(self, route: tuple[str, ...] | None = None, max_seqs: int | None = None) -> StageBatch:
        """The next micro-batch (of sequences on `route`, when given; at most `max_seqs` of them);
        empty when every such running sequence is in flight."""
        self._admit()
        batch = StageBatch(free_request_ids=self._pending_free)
        self._pending_free = []
        budget = self.max_num_batched_tokens
        for seq in self.running.values():
            if budget == 0 or (max_seqs is not None and len(batch.chunks) >= max_seqs):
                break
            if not self._may_schedule(seq) or (route is not None and seq.route != route):
                continue
            known = seq.num_tokens + seq.num_pending
            n = min(known - seq.num_computed_tokens, budget)
            sample = seq.num_computed_tokens + n == known
            batch.chunks.append(SequenceChunk(seq.request_id, seq.num_computed_tokens, n, sample,
                                              seq.sampling if sample else None))
            seq.num_computed_tokens += n
            seq.num_pending += sample
            budget -= n
        return batch

    def _may_schedule(self, seq: Sequence) -> bool:
        if seq.num_pending > self.lookahead:
            return False
        if seq.num_pending and (seq.num_computed_tokens < seq.num_tokens  # prefill still running
                                or len(seq.output_token_ids) + seq.num_pending >= seq.sampling.max_tokens):
            return False
        return seq.num_tokens + seq.num_pending > seq.num_computed_tokens

    def input_ids(self, batch: StageBatch) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        """The token ids a micro-batch feeds the first stage [T] (int64, host), and the rows whose
        token is still pending — (row, request_id), to be filled on the device (lookahead only)."""
        ids: list[int] = []
        pending: list[tuple[int, str]] = []
        for c in batch.chunks:
            seq = self.running[c.request_id]
            start, end = c.start_position, c.start_position + c.num_tokens
            n_prompt = len(seq.prompt_token_ids)
            if end > seq.num_tokens:  # the last token was sampled by a step still running
                pending.append((len(ids) + c.num_tokens - 1, c.request_id))
                end -= 1
                ids.extend(seq.output_token_ids[start - n_prompt:end - n_prompt] + [0])
            elif start >= n_prompt:  # decode: only generated tokens, no copy of the prompt
                ids.extend(seq.output_token_ids[start - n_prompt:end - n_prompt])
            else:
                ids.extend(seq.token_ids[start:end])
        return torch.tensor(ids, dtype=torch.int64), pending

    def on_tokens(self, batch: StageBatch, token_ids: list[int]) -> list[Sequence]:
        """The last stage's tokens for `batch` (one per sampled chunk). Returns sequences that got
        a token (finished ones included, already removed)."""
        updated = []
        for chunk, token in zip(batch.sampled, token_ids):
            seq = self.running.get(chunk.request_id)
            if seq is None:  # cancelled while in flight
                continue
            seq.num_pending -= 1
            seq.append_token(token)
            updated.append(seq)
            if seq.is_finished:
                self._release(seq)
        return updated

    def on_error(self, batch: StageBatch, error: str) -> list[Sequence]:
        """A micro-batch failed downstream: its sequences end with the error."""
        failed = []
        for chunk in batch.chunks:
            seq = self.running.get(chunk.request_id)
            if seq is not None and not seq.is_finished:
                seq.finish(FinishReason.ERROR, error)
                self._release(seq)
                failed.append(seq)
        return failed

    def cancel(self, request_id: str) -> Sequence | None:
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish(FinishReason.CANCELLED)
                return seq
        seq = self.running.get(request_id)
        if seq is not None:
            seq.finish(FinishReason.CANCELLED)
            self._release(seq)
        return seq

    def _release(self, seq: Sequence) -> None:
        del self.running[seq.request_id]
        self.num_reserved_blocks -= self.blocks_reserved_for(seq)
        self._pending_free.append(seq.request_id)

    def take_pending_free(self) -> list[str]:
        """Frees not yet sent with a batch (e.g. when the engine goes idle)."""
        ids, self._pending_free = self._pending_free, []
        return ids

    def routes_ready(self) -> list[tuple[str, ...]]:
        """Routes with a running sequence that could join a micro-batch now (admitting first)."""
        self._admit()
        seen: dict[tuple[str, ...], None] = {}
        for seq in self.running.values():
            if self._may_schedule(seq):
                seen.setdefault(seq.route, None)
        return list(seen)

    def num_running_on(self, route: tuple[str, ...]) -> int:
        return sum(seq.route == route for seq in self.running.values())

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_in_flight(self) -> int:
        return sum(s.in_flight for s in self.running.values())
