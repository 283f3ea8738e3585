"""One stage on one TP rank: its shard of the weights, its paged KV cache, its layers.

The engine knows nothing about requests, queues or the network: a `StageBatch` and its input
tensor (token ids on stage 0, the hidden stream elsewhere) go in; the hidden stream for the next
stage comes out, or, on the last stage, one sampled token id per sampled chunk.

On a one-stage model a step may also name pending rows, (row, j): the row's token is the previous
step's j-th sampled id, still on the device (overlap.py). A decode graph reads it there itself
(cuda_graphs.py); an eager step gathers it before the forward. Either way `last_sampled` is
that previous step's ids: with graphs, a view of the graphs' `sampled` buffer, which every
sampled step leaves holding its ids.

TP: rank 0 (the driver) calls `step`, which first broadcasts the batch and its inputs to the
followers; followers sit in `follow` and run the same `execute`. Every rank thus makes the same
block-manager calls in the same order and the ranks' block tables agree without being sent.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from shardline.config import ConfigError, EngineConfig
from shardline.gemm_tuning import GemmTable
from shardline.kernels._dispatch import TRITON_DISABLED
from shardline.kernels.attention import NO_SCALES, is_fp8
from shardline.kernels.embedding import resolve_ids
from shardline.manifest import Manifest, sha256_file
from shardline.model.transformer import StageModel, StepMetadata
from shardline.parallel import TPGroup
from shardline.sampler import sample
from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import SequenceChunk, StageBatch
from shardline.stage_worker.block_manager import BlockManager, OutOfBlocks
from shardline.stage_worker.cuda_graphs import CudaGraphRunner, write_src
from shardline.stage_worker.kv_cache import KVCache, kv_cache_dtype, plan_num_blocks
from shardline.stage_worker.staging import DeferredTokens, HostStep, PinnedStaging, TokenReadback
from shardline.wire import DTYPE_NAMES, DTYPES_BY_NAME, MODEL_DTYPES

CPU_DEFAULT_KV_BYTES = 256 << 20
log = logging.getLogger("shardline.stage_worker")


def load_shard(model_dir: str | Path, manifest: Manifest, stage: int, rank: int,
               device: torch.device, verify: bool) -> dict[str, torch.Tensor]:
    spec = manifest.shard(stage, rank)
    path = Path(model_dir) / spec.file
    if not path.is_file():
        raise ConfigError(f"shard {path} is missing; re-run `shardline convert`")
    if verify and sha256_file(path) != spec.sha256:
        raise ConfigError(f"shard {path} does not match its checksum in manifest.json; "
                          f"the file is corrupt or from another conversion")
    weights = {}
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        for name in f.keys():
            weights[name] = f.get_tensor(name)
    return weights


class StageEngine:
    def __init__(self, model_dir: str | Path | None, stage: int, tp: TPGroup, config: EngineConfig,
                 manifest: Manifest | None = None, weights: dict[str, torch.Tensor] | None = None,
                 kv_share: float = 1.0) -> None:
        """`weights` (with `manifest`) instead of a model directory: benchmarks on random weights.

        `kv_share`: the part of the GPU memory left for KV caches that this engine takes (several
        stages in one process split it; a stage-worker pod takes it all).
        """
        self.manifest = manifest or Manifest.read(model_dir)
        if tp.size != self.manifest.tp:
            raise ConfigError(f"the model was converted for tp={self.manifest.tp}, but this group has "
                              f"{tp.size} ranks; re-convert with --tp {tp.size} or start {self.manifest.tp} ranks")
        self.spec = self.manifest.stage(stage)
        self.stage, self.tp, self.config = stage, tp, config
        self.device = torch.device(config.device)
        self.is_first = stage == 0
        self.is_last = stage == self.manifest.pp - 1
        cfg = self.manifest.model
        self.model_config = cfg
        self.max_model_len = min(config.max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        if weights is None:
            weights = load_shard(model_dir, self.manifest, stage, tp.rank, self.device, config.verify_checksums)
        self.model = StageModel(cfg, tp, weights, self.spec.layer_start, self.spec.layer_end,
                                self.is_first, self.is_last)
        self.dtype = MODEL_DTYPES[self.manifest.dtype]
        gemm_buckets: set[int] = set()  # row counts the GEMM table has entries for
        if config.gemm_config and self.device.type == "cuda":
            table = GemmTable.load(config.gemm_config, self.device)
            if table is not None:
                gemm_buckets = {m for by_m in table.entries.values() for m in by_m}
                log.info("stage %d rank %d: GEMM config %s (%s): entries at %s rows", stage, tp.rank,
                         config.gemm_config, table.gpu, ", ".join(map(str, sorted(gemm_buckets))))
                self.model.configure_gemms(table)
                gaps = self.model.gemm_bucket_gaps(table)
                if gaps:
                    log.warning("GEMM config %s: %s lack batch buckets the other projections have, so those "
                                "rows run them on a larger bucket's entries; re-run `shardline tune-gemm "
                                "--batches ...` covering every bucket for every linear", config.gemm_config, gaps)
        elif config.gemm_config:
            log.info("stage %d rank %d: GEMM config %s not read: its tables choose GPU kernels, and on %s "
                     "torch runs every linear", stage, tp.rank, config.gemm_config, self.device.type)
        num_kv_heads = cfg.num_kv_heads // tp.size
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device)
        num_blocks = config.num_blocks or plan_num_blocks(
            int(self._kv_budget() * kv_share), self.spec.num_layers, config.block_size, num_kv_heads, cfg.head_dim,
            self.kv_dtype)
        # Every rank runs the same block-manager calls, so every rank needs the same block count.
        num_blocks = tp.min_int(num_blocks)
        self.kv_cache = KVCache(self.spec.num_layers, num_blocks, config.block_size, num_kv_heads,
                                cfg.head_dim, self.kv_dtype, self.device)
        self.kv_layers = self.kv_cache.layers()
        log.info("stage %d rank %d: KV cache (%s%s) of %d blocks x %d tokens = %d tokens (%d sequences of 2,048)",
                 stage, tp.rank, str(self.kv_dtype).removeprefix("torch."), self._kv_scales_note(), num_blocks,
                 config.block_size, num_blocks * config.block_size, num_blocks * config.block_size // 2048)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.graphs = None
        if self.device.type == "cuda" and config.use_cuda_graphs and not TRITON_DISABLED:
            self.graphs = CudaGraphRunner(self.model, self.kv_layers, config.max_num_seqs, self.max_model_len,
                                          config.block_size)
            if config.capture_graphs_at_start:
                try:
                    self.graphs.capture_all()
                except torch.cuda.OutOfMemoryError as e:
                    raise ConfigError(f"capturing the decode graphs ran out of GPU memory ({e}); leave more "
                                      f"room with a lower --gpu-memory-fraction or --max-num-seqs, or capture "
                                      f"on first use with --lazy-graphs") from None
        self.readback = TokenReadback(config.max_num_seqs, self.device)
        # [ids | src] of a step that gathers its pending ids before the forward (_gather_pending).
        self.id_staging = PinnedStaging(2 * config.max_num_batched_tokens, self.device)
        self.last_sampled: torch.Tensor | None = None  # the previous step's sampled ids, on the device
        self.num_steps = 0
        self.num_tokens = 0
        self.busy_seconds = 0.0
        if self.device.type == "cuda" and config.capture_graphs_at_start:
            buckets = gemm_buckets | set(self.graphs.batch_buckets if self.graphs else ())
            self.warm_up(warm_up_token_counts(buckets, config.max_num_batched_tokens))

    def warm_up(self, token_counts: list[int]) -> None:
        """Run one eager step of a made-up prompt of each of `token_counts` tokens, then forget it
        (its blocks, its sampled id, the step counters). Triton compiles a kernel the first time it
        meets a new specialization: without this, the first requests of a new replica each waited
        ~0.8 s a compile (docs/benchmarks.md, session s). Every rank runs it (in __init__), in the
        same order, so their collectives pair up."""
        started = time.perf_counter()
        rid = "__shardline_warm_up__"
        for n in token_counts:
            if self.block_manager.num_free_blocks * self.block_manager.block_size < n or n > self.max_model_len:
                continue
            inputs = (torch.zeros(n, dtype=torch.int64) if self.is_first else
                      torch.zeros(n, self.model_config.hidden_size, dtype=self.dtype, device=self.device))
            self.execute(StageBatch([SequenceChunk(rid, 0, n, sample=True, sampling=SamplingParams())]), inputs)
            self.block_manager.free(rid)
        self.last_sampled = None
        self.num_steps, self.num_tokens, self.busy_seconds = 0, 0, 0.0
        log.info("stage %d rank %d: warmed up the eager kernels on prompts of %s tokens in %.1f s", self.stage,
                 self.tp.rank, token_counts, time.perf_counter() - started)

    def _kv_scales_note(self) -> str:
        """What the log says of the checkpoint's KV-cache scales (attention.KVScales)."""
        if all(layer.kv_scales == NO_SCALES for layer in self.model.layers):
            return ", no scales" if is_fp8(self.kv_dtype) else ""
        return (", k/v scales from the checkpoint" if is_fp8(self.kv_dtype)
                else "; the checkpoint's k/v scales are for an fp8 cache (--kv-cache-dtype fp8) and go unused")

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.device.type != "cuda":
            return CPU_DEFAULT_KV_BYTES
        free, total = torch.cuda.mem_get_info(self.device)
        reserve = int(total * (1 - self.config.gpu_memory_fraction))
        return max(free - reserve, 0)

    # -- the step ---------------------------------------------------------------------------------

    def step(self, batch: StageBatch, inputs: torch.Tensor, defer_tokens: bool = False,
             pending: list[tuple[int, int]] | None = None) -> torch.Tensor | list[int] | DeferredTokens:
        """Driver only: send the step to the followers, then run it here too.

        `defer_tokens` (last stage): return the sampled ids as DeferredTokens without waiting for
        them, so the caller can launch the next step first (overlap.py). `pending`: see the module
        docstring; with TP > 1 the driver gathers those ids before it broadcasts the inputs, so
        followers never see pending rows."""
        if self.tp.size > 1:
            if pending:
                inputs, pending = self._gather_pending(inputs, pending), None
            self.tp.broadcast_json({"op": "step", "stage": self.stage, "batch": batch.to_dict(),
                                    "shape": list(inputs.shape), "dtype": DTYPE_NAMES[inputs.dtype]})
            inputs = self.tp.broadcast_tensor(inputs.to(self.tp.device), tuple(inputs.shape), inputs.dtype)
        return self.execute(batch, inputs, defer_tokens, pending)

    def free(self, request_ids: list[str]) -> None:
        """Driver only: free sequences' KV blocks on every rank."""
        if self.tp.size > 1:
            self.tp.broadcast_json({"op": "free", "stage": self.stage, "request_ids": list(request_ids)})
        for rid in request_ids:
            self.block_manager.free(rid)

    @torch.inference_mode()
    def execute(self, batch: StageBatch, inputs: torch.Tensor, defer_tokens: bool = False,
                pending: list[tuple[int, int]] | None = None) -> torch.Tensor | list[int] | DeferredTokens:
        """Run one step on this rank. Raises OutOfBlocks/ConfigError before touching the cache."""
        started = time.perf_counter()
        for rid in batch.free_request_ids:
            self.block_manager.free(rid)
        if not batch.chunks:
            return [] if self.is_last else inputs
        step = self._prepare(batch)
        ran = self.graphs.run(inputs, step, pending) if self._fits_graph(batch, step) else None
        if log.isEnabledFor(logging.DEBUG):  # SHARDLINE_LOG_LEVEL=DEBUG: one line a step
            log.debug("step %d at %.4f: %d chunks, %d tokens, longest query %d, %s", self.num_steps, started,
                      len(batch.chunks), batch.num_tokens, step.max_query_len, "graph" if ran is not None else "eager")
        if ran is not None:
            out, greedy, greedy_host = ran
        else:
            if pending:
                inputs = self._gather_pending(inputs, pending)
            meta = _to_device(step.metadata(), self.device)
            out, greedy, greedy_host = self.model.forward(inputs.to(self.device), meta, self.kv_layers), None, None
        if self.is_last and not batch.return_logits:
            ids = self._sample(batch, out, greedy)
            # Every row greedy in a graph: the graph has written the ids to host memory itself.
            deferred = greedy_host if ids is greedy else None
            if defer_tokens:
                out = deferred if deferred is not None else self.readback.start(ids)
            else:
                out = deferred.tolist() if deferred is not None else ids.tolist()
        elif self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.num_steps += 1
        self.num_tokens += batch.num_tokens
        self.busy_seconds += time.perf_counter() - started
        return out

    def _fits_graph(self, batch: StageBatch, step: HostStep) -> bool:
        """Whether the step may replay a decode graph: one token a chunk, and on the last stage
        every chunk sampled (a graph's row i is the step's i-th sampled row; a chunk of one prompt
        token that is not its last samples nothing)."""
        return (self.graphs is not None and step.max_query_len == 1 and not batch.return_logits
                and (not self.is_last or len(step.sample_rows) == len(step.seq_lens)))

    def _gather_pending(self, ids: torch.Tensor, pending: list[tuple[int, int]]) -> torch.Tensor:
        """The step's token ids [T] on the device: the host's `ids`, each pending (row, j) taking
        the previous step's sampled id j, as a decode graph does. [ids | src] goes up in one
        pinned copy (no wait)."""
        n = len(ids)
        host = np.empty(2 * n, dtype=np.int64)
        host[:n] = ids.numpy()
        write_src(host[n:], pending)
        staged = self.id_staging.to_device(host)
        return resolve_ids(staged[:n], staged[n:], self.last_sampled)

    def _sample(self, batch: StageBatch, logits: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        """The ids drawn for the batch's sampled chunks, on the device, kept as `last_sampled`.
        `greedy`: a decode graph's argmax of the same rows, already in the graphs' `sampled`; ids
        drawn otherwise are copied there, where the next replay reads its pending rows."""
        sampled = batch.sampled
        if not sampled:
            ids = torch.empty(0, dtype=torch.int64, device=self.device)
        else:
            positions = torch.tensor([c.start_position + c.num_tokens for c in sampled])
            ids = sample(logits, [c.sampling for c in sampled], positions, greedy)
        if self.graphs is not None and ids is not greedy:
            ids = self.graphs.sampled[:len(ids)].copy_(ids)
        self.last_sampled = ids
        return ids

    def _prepare(self, batch: StageBatch) -> HostStep:
        """Allocate the step's KV blocks and describe the step (plain host lists)."""
        bm = self.block_manager
        missing = 0
        for c in batch.chunks:
            end = c.start_position + c.num_tokens
            if end > self.max_model_len:
                raise ConfigError(f"sequence {c.request_id} reaches {end} tokens, beyond the "
                                  f"model's context of {self.max_model_len}")
            missing += max(bm.blocks_needed(end) - len(bm.block_tables.get(c.request_id, ())), 0)
        if missing > bm.num_free_blocks:
            raise OutOfBlocks(f"this step needs {missing} more KV blocks on stage {self.stage}, "
                              f"{bm.num_free_blocks} are free")
        step = HostStep()
        bs = bm.block_size
        for c in batch.chunks:
            end = c.start_position + c.num_tokens
            table = bm.allocate(c.request_id, end)
            pos = range(c.start_position, end)
            step.positions.extend(pos)
            step.slots.extend(table[p // bs] * bs + p % bs for p in pos)
            step.tables.append(table)
            step.seq_lens.append(end)
            step.starts.append(step.starts[-1] + c.num_tokens)
            if batch.return_logits:
                step.sample_rows.extend(range(step.starts[-2], step.starts[-1]))
            elif c.sample:
                step.sample_rows.append(step.starts[-1] - 1)
            step.max_query_len = max(step.max_query_len, c.num_tokens)
        step.max_seq_len = max(step.seq_lens)
        step.needs_logits = batch.return_logits or any(c.sampling is None or not c.sampling.is_greedy
                                                       for c in batch.sampled)
        return step

    # -- introspection ----------------------------------------------------------------------------

    def status(self) -> dict:
        bm = self.block_manager
        return {"stage": self.stage, "layer_start": self.spec.layer_start, "layer_end": self.spec.layer_end,
                "tp": self.tp.size, "num_blocks": bm.num_blocks, "free_blocks": bm.num_free_blocks,
                "block_size": bm.block_size, "running": bm.request_ids, "steps": self.num_steps,
                "tokens": self.num_tokens, "busy_seconds": self.busy_seconds}


def warm_up_token_counts(buckets: set[int] | list[int], max_tokens: int) -> list[int]:
    """Token counts whose eager steps meet every kernel variant a step of up to `max_tokens` can:
    counts between two neighbouring `buckets` (row counts that pick a GEMM configuration or a
    graph) share configurations, and Triton specializes an integer argument on whether it is
    divisible by 16, so each such range gives its smallest count of each kind. (One token is a
    decode graph's.)"""
    edges = sorted({b for b in buckets if 1 <= b < max_tokens} | {max_tokens})
    counts, lo = set(), 1
    for hi in edges:
        plain = next((c for c in range(lo + 1, hi + 1) if c % 16), None)
        even = -(-(lo + 1) // 16) * 16
        counts.update(c for c in (plain, even) if c is not None and c <= hi)
        lo = hi
    counts.add(max_tokens)
    counts.discard(1)
    return sorted(counts)


def _to_device(meta: StepMetadata, device: torch.device) -> StepMetadata:
    if device.type == "cpu":
        return meta
    fields = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in vars(meta).items()}
    return StepMetadata(**fields)


def follow(tp: TPGroup, engines: dict[int, StageEngine]) -> None:
    """Follower ranks: run what the driver broadcasts until it says stop."""
    while True:
        msg = tp.broadcast_json(None)
        op = msg["op"]
        if op == "stop":
            return
        engine = engines[msg["stage"]]
        if op == "free":
            for rid in msg["request_ids"]:
                engine.block_manager.free(rid)
        elif op == "step":
            inputs = tp.broadcast_tensor(None, tuple(msg["shape"]), DTYPES_BY_NAME[msg["dtype"]])
            try:
                # The driver samples and reads the tokens; a follower's own copy of them is never
                # read, so it does not wait for them (it runs ahead to the next broadcast).
                engine.execute(StageBatch.from_dict(msg["batch"]), inputs, defer_tokens=True)
            except (ConfigError, OutOfBlocks):
                pass  # the driver raises the same error from the same check and reports it


def stop_followers(tp: TPGroup) -> None:
    if tp.size > 1:
        tp.broadcast_json({"op": "stop"})
