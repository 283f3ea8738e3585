"""Decode steps replayed from captured CUDA graphs.

A decode step of an 8B model launches ~10 kernels per layer; from Python that is a few hundred
microseconds of launch overhead per step on top of ~3.5 ms of weight streaming. A captured graph
replays the whole stage's step with one launch. Graphs are captured lazily, one per
(batch bucket, context bucket): the batch is padded up to its bucket (padding rows write to slot
-1, which the kernels skip, and their outputs are dropped), and the context bucket bounds the
block-table width, so decode attention's split-K fits the real contexts, not the model's maximum.

Every graph reads its step from one flat int64 device buffer, laid out per graph as
[ids b | src b | positions b | slots b | seq_lens b int32 | block table b x width int32 |
logits wanted 1 | skip 1 | ids row 1]. The host fills the same layout in a mailbox of pinned
host memory, and the graph's first kernel takes it from there over PCIe (shardline/kernels/step_io.py): no
copy engine between two replays (a copy up and one down cost a 64-row step 14-17 µs between
graphs, the two kernels nothing measurable; docs/benchmarks.md). The mailbox is refilled once the
last take of it has run (an event recorded inside every graph, and after an eager take), so
launching a step never waits for the one before it to end. Only the first stage's token ids or
another stage's hidden rows, and that metadata, change between replays; ids already on the device
are copied into the buffer before the replay and `skip` keeps the graph from taking the
mailbox's over them.

A last stage's graph ends with the greedy argmax of its logits, written to the persistent buffer
`sampled`, and a kernel that writes those ids into the row `ids row` names of a ring of pinned
host memory (staging.IdRing), which the step's DeferredTokens reads once the replay is done. The
engine replays only steps in which every row samples, so row j there is the step's j-th sampled
id; where rows sample at a temperature, the engine writes the drawn ids over it. In a step where
every row is greedy nothing reads the logits, and a head whose epilogue leaves the ids skips
writing them (64 x 128,256 fp32 values, 33 MB a step for Llama-3 at 64 rows).

On a one-stage model the graph also starts from `sampled`: a row whose token the previous step is
still sampling (overlap.py) has `src` = that token's row in `sampled`, and `src` = -1 takes the
host id. A greedy decode step is then one replay, with nothing before or after it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from shardline.graph_capture import collected_garbage
from shardline.kernels import step_io
from shardline.model.transformer import PendingIds, StageModel, StepMetadata
from shardline.stage_worker.staging import DeferredTokens, HostStep, IdRing

log = logging.getLogger("shardline.stage_worker")
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
        numel = StepLayout(B, W).numel
        on_gpu = dev.type == "cuda"
        self.mailbox = torch.zeros(numel, dtype=torch.int64, pin_memory=on_gpu)  # mapped: graphs read it
        self.mailbox_np = self.mailbox.numpy()
        # Recorded inside every graph once its first kernel has taken the mailbox.
        self.taken = torch.cuda.Event(external=True) if on_gpu else None
        self.buffer = torch.zeros(numel, dtype=torch.int64, device=dev)
        self.hidden = None if model.is_first else torch.zeros(B, model.cfg.hidden_size, dtype=model.dtype, device=dev)
        self.query_start_loc = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.sample_rows = torch.arange(B, dtype=torch.int64, device=dev)
        # The last replayed step's sampled ids (last stage): what the next replay's pending rows read.
        self.sampled = torch.zeros(B, dtype=torch.int64, device=dev) if model.is_last else None
        self.host_ids = IdRing(4, B, dev) if model.is_last else None  # where a graph's last kernel puts them
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.num_replays = 0

    def reset(self) -> None:
        """Drop every captured graph and their memory pool: the next steps capture again (after a
        kernel's tiles change, e.g. `decode_bench.py --attention-configs`)."""
        self.graphs.clear()
        self.pool = None
        torch.cuda.synchronize(self.device)

    def buckets(self, num_seqs: int, max_seq_len: int) -> tuple[int, int] | None:
        """The graph a decode step of `num_seqs` sequences (longest `max_seq_len`) replays, or None."""
        bi = bisect.bisect_left(self.batch_buckets, num_seqs)
        ci = bisect.bisect_left(self.context_buckets, max_seq_len)
        if bi == len(self.batch_buckets) or ci == len(self.context_buckets):
            return None
        return self.batch_buckets[bi], self.context_buckets[ci]

    def capture_all(self) -> None:
        """Capture every (batch, context) bucket now, largest first (the smaller graphs then reuse
        the pool's blocks), so no request waits for a capture."""
        started = time.perf_counter()
        for ctx in reversed(self.context_buckets):
            for b in reversed(self.batch_buckets):
                if (b, ctx) not in self.graphs:
                    self.graphs[(b, ctx)] = self._capture(b, ctx)
        log.info("captured %d decode graphs (batches %s x contexts %s) in %.1f s", len(self.graphs),
                 self.batch_buckets, self.context_buckets, time.perf_counter() - started)

    def captured(self, key: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """(graph, output) of bucket `key` (batch, context), captured now if it was not yet."""
        if key not in self.graphs:
            started = time.perf_counter()
            self.graphs[key] = self._capture(*key)
            log.info("captured the decode graph for %d rows, context %d, in %.0f ms", *key,
                     1e3 * (time.perf_counter() - started))
        return self.graphs[key]

    def _layout(self, b: int, ctx: int) -> "StepLayout":
        return StepLayout(b, -(-ctx // self.block_size))

    def _step(self, b: int, ctx: int) -> Callable[[], torch.Tensor]:
        """What graph (b, ctx) runs: its inputs from the buffer, the stage, and on a last stage the
        greedy argmax into `sampled`. Returns the stage's output [b, ...]."""
        ids, src, meta = self._layout(b, ctx).views(self.buffer, self.query_start_loc, self.sample_rows, ctx)
        model = self.model

        # A one-stage model's first kernel reads `sampled` before this step's argmax overwrites it
        # (one stream, in order).
        pending = PendingIds(src, self.sampled) if model.is_first and model.is_last else None

        def step() -> torch.Tensor:
            return model.forward(ids if model.is_first else self.hidden[:b], meta, self.kv_layers, pending,
                                 greedy=self.sampled[:b] if model.is_last else None)

        return step

    def _capture(self, b: int, ctx: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        step = self._step(b, ctx)
        layout = self._layout(b, ctx)
        self.load(b, ctx)
        # The warm-up runs the step for real: keep the sampled ids that a step being launched
        # (a graph captured on first use) may still read.
        sampled = self.sampled.clone() if self.sampled is not None else None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                step()
            self._give(b, layout)  # to the row load claimed
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if sampled is not None:
            self.sampled.copy_(sampled)
        graph = torch.cuda.CUDAGraph()
        with collected_garbage(), torch.cuda.graph(graph, pool=self.pool):
            out = self._replayed(b, ctx, step)
        if self.pool is None:
            self.pool = graph.pool()
        return graph, out

    def _replayed(self, b: int, ctx: int, step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """What a replay of graph (b, ctx) runs: the step taken from the mailbox, the stage, and
        on a last stage its ids given to the host ring. Returns the stage's output."""
        layout = self._layout(b, ctx)
        step_io.take(self.mailbox, self.buffer[:layout.numel], layout.skip_at)
        if self.taken is not None:
            self.taken.record()
        out = step()
        self._give(b, layout)
        return out

    def _give(self, b: int, layout: "StepLayout") -> None:
        """A last stage's ids to the host ring row the step names."""
        if self.host_ids is not None:
            step_io.give(self.sampled[:b], self.buffer, layout.ids_row_at, self.host_ids.host)

    def _mailbox_free(self) -> None:
        """Wait until the last take of the mailbox queued (by the graph launched last, or by
        `load`) has run: at once, unless it has not started yet."""
        if self.taken is not None:
            self.taken.synchronize()

    def load(self, b: int, ctx: int, step: HostStep | None = None) -> None:
        """Fill graph (b, ctx)'s inputs with `step`, or with b padding rows (context 1 in block 0,
        writing nowhere): what a graph is warmed up on, and what a benchmark replays it on. Graphs
        lay their inputs out differently in the shared buffer, so one replayed on another's step
        would read garbage. The buffer takes them now (for an eager run of the step) and the
        graph again at each replay."""
        layout = self._layout(b, ctx)
        row = self.host_ids.claim() if self.host_ids is not None else 0  # a row no step in flight holds
        self._mailbox_free()
        layout.fill(self.mailbox_np, step or HostStep(), ids_row=row)
        step_io.take(self.mailbox, self.buffer[:layout.numel], layout.skip_at)
        if self.taken is not None:
            self.taken.record()  # the next fill of the mailbox waits for this take too

    def run(self, inputs: torch.Tensor, step: HostStep, pending: list[tuple[int, int]] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, DeferredTokens | None] | None:
        """A decode step (a HostStep of n rows) and its inputs in; None when no graph fits, else
        the stage's output for those n rows and, on a last stage, their greedy ids [n] (a view of
        `sampled`, overwritten by the next replay) and the same ids on their way to the host.
        Host token ids travel in the mailbox; device inputs (ids resolved on the GPU, or hidden
        rows) are copied into the graph's own.

        `pending` (one-stage model, host ids): (row, j) for each row whose id is the previous
        step's j-th sampled id, which the graph reads from `sampled`."""
        n = len(step.seq_lens)
        key = self.buckets(n, step.max_seq_len)
        if key is None:
            return None
        graph, out = self.captured(key)
        b, ctx = key
        layout = self._layout(b, ctx)
        host_ids = self.model.is_first and inputs.device.type == "cpu"
        assert not pending or (host_ids and self.model.is_last), "pending rows need host ids on a one-stage model"
        row = self.host_ids.claim() if self.host_ids is not None else 0
        self._mailbox_free()
        layout.fill(self.mailbox_np, step, inputs.numpy() if host_ids else None, pending,
                    skip=b if self.model.is_first and not host_ids else 0, ids_row=row)
        if not host_ids:
            dst = self.buffer[:n] if self.model.is_first else self.hidden[:n]
            dst.copy_(inputs, non_blocking=True)
        graph.replay()
        self.num_replays += 1
        if self.host_ids is None:
            return out[:n], None, None
        return out[:n], self.sampled[:n], self.host_ids.deferred(row, n)


def write_src(src: np.ndarray, pending: list[tuple[int, int]] | None) -> None:
    """A step's src column (model/transformer.py's PendingIds): -1 but for each pending (row, j), where it is j."""
    src[:] = -1
    if pending:
        rows, js = np.asarray(pending, dtype=np.int64).T
        src[rows] = js


class StepLayout:
    """Where a graph of b rows and block-table width w finds each part of its step in the flat
    int64 buffer. Padding rows (n..b) get id 0, src -1, slot -1 (the cache write skips them),
    context 1 and block 0; their outputs are dropped."""

    def __init__(self, b: int, width: int) -> None:
        self.b, self.width = b, width
        self.seq_lens_at = 4 * b  # in int64 units; seq_lens and the table are int32
        self.tables_at = self.seq_lens_at + (b + 1) // 2
        self.logits_at = self.tables_at + (b * width + 1) // 2
        self.skip_at = self.logits_at + 1  # the graph takes the mailbox's words from this one on
        self.ids_row_at = self.skip_at + 1  # the host ring's row for the step's sampled ids
        self.numel = self.ids_row_at + 1

    def views(self, buffer: torch.Tensor, query_start_loc: torch.Tensor, sample_rows: torch.Tensor,
              ctx: int) -> tuple[torch.Tensor, torch.Tensor, StepMetadata]:
        """(ids [b], src [b], metadata) as views of `buffer`."""
        b, w = self.b, self.width
        as32 = buffer.view(torch.int32)
        meta = StepMetadata(positions=buffer[2 * b:3 * b], slot_mapping=buffer[3 * b:4 * b],
                            seq_lens=as32[2 * self.seq_lens_at:2 * self.seq_lens_at + b],
                            block_tables=as32[2 * self.tables_at:2 * self.tables_at + b * w].view(b, w),
                            query_start_loc=query_start_loc[:b + 1], sample_rows=sample_rows[:b],
                            max_query_len=1, max_seq_len=ctx,
                            logits_wanted=buffer[self.logits_at:self.logits_at + 1])
        return buffer[:b], buffer[b:2 * b], meta

    def fill(self, buf: np.ndarray, step: HostStep, ids: np.ndarray | None = None,
             pending: list[tuple[int, int]] | None = None, skip: int = 0, ids_row: int = 0) -> None:
        """Write `step` (n <= b rows) into the host array `buf` in this layout; each (row, j) of
        `pending` reads its id from the previous step's sampled id j instead of `ids`. `skip`: the
        graph leaves the buffer's first words as they are (b: ids the host copies on the device);
        `ids_row`: the host ring's row for the sampled ids."""
        b, w, n = self.b, self.width, len(step.seq_lens)
        buf[:b] = 0
        if ids is not None:
            buf[:n] = ids
        write_src(buf[b:2 * b], pending)
        buf[2 * b:2 * b + n] = step.positions
        buf[2 * b + n:3 * b] = 0
        buf[3 * b:3 * b + n] = step.slots
        buf[3 * b + n:4 * b] = -1
        as32 = buf.view(np.int32)
        seq_lens = as32[2 * self.seq_lens_at:2 * self.seq_lens_at + b]
        seq_lens[:n] = step.seq_lens
        seq_lens[n:] = 1
        tables = as32[2 * self.tables_at:2 * self.tables_at + b * w].reshape(b, w)
        for i, t in enumerate(step.tables):
            tables[i, :len(t)] = t
        tables[n:, 0] = 0
        buf[self.logits_at] = int(step.needs_logits)
        buf[self.skip_at] = skip
        buf[self.ids_row_at] = ids_row
