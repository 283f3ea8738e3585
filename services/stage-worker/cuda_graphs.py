"""Decode steps replayed from captured CUDA graphs.

A decode step of an 8B model launches ~10 kernels per layer; from Python that is a few hundred
microseconds of launch overhead per step on top of ~3.5 ms of weight streaming. A captured graph
replays the whole stage's step with one launch. Graphs are captured lazily, one per
(batch bucket, context bucket): the batch is padded up to its bucket (padding rows write to slot
-1, which the kernels skip, and their outputs are dropped), and the context bucket bounds the
block-table width, so decode attention's split-K fits the real contexts, not the model's maximum.

Static buffers are shared by all graphs (views of different sizes); every input is copied into
them before a replay. Only the first stage's token ids or another stage's hidden rows, and the
step metadata, change between replays.
"""

from __future__ import annotations

import bisect

import torch

from shardline.model.transformer import StageModel, StepMetadata

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
CONTEXT_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144)


class CudaGraphRunner:
    def __init__(self, model: StageModel, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
                 max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.model, self.kv_layers, self.block_size = model, kv_layers, block_size
        self.device = model.device
        self.batch_buckets = [b for b in BATCH_BUCKETS if b < max_num_seqs] + [max_num_seqs]
        self.context_buckets = [c for c in CONTEXT_BUCKETS if c < max_model_len] + [max_model_len]
        B, W = self.batch_buckets[-1], -(-max_model_len // block_size)
        dev = self.device
        if model.is_first:
            self.inputs = torch.zeros(B, dtype=torch.int64, device=dev)
        else:
            self.inputs = torch.zeros(B, model.cfg.hidden_size, dtype=model.dtype, device=dev)
        self.positions = torch.zeros(B, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((B,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(B, W, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.sample_rows = torch.arange(B, dtype=torch.int64, device=dev)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def buckets(self, num_seqs: int, max_seq_len: int) -> tuple[int, int] | None:
        """The graph a decode step of `num_seqs` sequences (longest `max_seq_len`) replays, or None."""
        bi = bisect.bisect_left(self.batch_buckets, num_seqs)
        ci = bisect.bisect_left(self.context_buckets, max_seq_len)
        if bi == len(self.batch_buckets) or ci == len(self.context_buckets):
            return None
        return self.batch_buckets[bi], self.context_buckets[ci]

    def _meta(self, b: int, ctx: int) -> StepMetadata:
        width = -(-ctx // self.block_size)
        return StepMetadata(positions=self.positions[:b], slot_mapping=self.slot_mapping[:b],
                            block_tables=self.block_tables[:b, :width], seq_lens=self.seq_lens[:b],
                            query_start_loc=self.query_start_loc[:b + 1], sample_rows=self.sample_rows[:b],
                            max_query_len=1, max_seq_len=ctx)

    def _capture(self, b: int, ctx: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        meta = self._meta(b, ctx)
        inputs = self.inputs[:b]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                self.model.forward(inputs, meta, self.kv_layers)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward(inputs, meta, self.kv_layers)
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int) -> torch.Tensor | None:
        """Host tensors of n decode rows in, the stage's output for those rows out (None: no graph fits)."""
        n = positions.shape[0]
        key = self.buckets(n, max_seq_len)
        if key is None:
            return None
        b, _ = key
        # Padding rows: slot -1 (skipped by the cache write), context 1, block 0; outputs dropped.
        self.slot_mapping[n:b].fill_(-1)
        self.seq_lens[n:b].fill_(1)
        self.inputs[:n].copy_(inputs, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.block_tables[:n, :block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:n]
