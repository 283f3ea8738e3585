"""A whole model in one process per TP rank: every stage, driven by stage 0's scheduler.

This is the engine without the network — what tests and `shardline generate` drive. Activations
still cross each stage boundary as raw bytes (the same codec the gRPC transport uses), so the
boundary is exercised even here. With TP > 1, `generate_local` runs one process per rank over
gloo (CPU) or NCCL (GPU); rank 0 drives, the others follow.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing.connection
import signal
import traceback
import uuid
from pathlib import Path

import torch

from shardline.config import EngineConfig
from shardline.launcher import free_port
from shardline.manifest import Manifest
from shardline.parallel import TPGroup, init_tp_group, leave_tp_group, rank_device, single_rank
from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import SequenceChunk, StageBatch
from shardline.stage_worker.engine import StageEngine, follow, stop_followers
from shardline.stage_worker.overlap import OverlappedStepper, wants_overlap
from shardline.stage_worker.scheduler import Scheduler
from shardline.stage_worker.sequence import Sequence
from shardline.wire import tensor_from_bytes, tensor_to_bytes


class LocalPipeline:
    def __init__(self, model_dir: str | Path | None, tp: TPGroup | None = None,
                 config: EngineConfig | None = None, engines: list[StageEngine] | None = None) -> None:
        """From a converted model directory, or from already-built `engines` (benchmarks)."""
        self.tp = tp or single_rank()
        self.config = config or EngineConfig()
        if engines is None:
            manifest = Manifest.read(model_dir)
            # Every stage in this one process: stage s takes 1/(pp - s) of the KV memory still free.
            engines = [StageEngine(model_dir, s, self.tp, self.config, manifest, kv_share=1 / (manifest.pp - s))
                       for s in range(manifest.pp)]
        self.engines = engines
        self.manifest = engines[0].manifest
        first = self.engines[0]
        overlap = wants_overlap(first)
        self.scheduler = Scheduler.for_engine(first, min(e.block_manager.num_blocks for e in self.engines),
                                              lookahead=1 if overlap else 0)
        self.stepper = OverlappedStepper(first, self.scheduler) if overlap else None

    def run_batch(self, batch: StageBatch, input_ids: torch.Tensor) -> torch.Tensor | list[int]:
        x: torch.Tensor | list[int] = input_ids
        for engine in self.engines:
            x = engine.step(batch, x)
            if not engine.is_last:
                x = tensor_from_bytes(*tensor_to_bytes(x), device=engine.device)  # the stage boundary
        return x

    def generate(self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Generated token ids (not the prompt) for each prompt, batched continuously."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        eos = self.manifest.model.eos_token_ids
        seqs = [Sequence(f"local-{uuid.uuid4().hex[:12]}", list(p), sp, eos) for p, sp in zip(prompts, params)]
        for seq in seqs:
            self.scheduler.add(seq)
        while self.scheduler.has_work or (self.stepper and self.stepper.has_launched):
            batch = self.scheduler.schedule()
            if self.stepper is not None:
                done = self.stepper.step(batch)
                if done is not None:
                    self.scheduler.on_tokens(*done)
                continue
            if batch.chunks:
                self.scheduler.on_tokens(batch, self.run_batch(batch, self.scheduler.input_ids(batch)[0]))
        freed = self.scheduler.take_pending_free()
        for engine in self.engines:
            engine.free(freed)
        return [s.output_token_ids for s in seqs]

    def logits(self, prompt: list[int]) -> torch.Tensor:
        """Logits [len(prompt), V] (fp32) at every position of one prompt, in one prefill."""
        rid = f"logits-{uuid.uuid4().hex[:12]}"
        batch = StageBatch([SequenceChunk(rid, 0, len(prompt), True)], return_logits=True)
        try:
            return self.run_batch(batch, torch.tensor(prompt, dtype=torch.int64)).cpu()
        finally:
            for engine in self.engines:
                engine.free([rid])

    def close(self) -> None:
        stop_followers(self.tp)


# -- one process per TP rank ----------------------------------------------------------------------

def _run_jobs(pipeline: LocalPipeline, jobs: list[tuple]) -> list:
    out = []
    for kind, args in jobs:
        out.append(pipeline.generate(*args) if kind == "generate" else pipeline.logits(*args))
    return out


def _rank_main(rank: int, size: int, init_method: str, model_dir: str, config: EngineConfig,
               jobs: list[tuple], results) -> None:
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where a stuck rank waits
    config = dataclasses.replace(config, device=rank_device(config.device, rank))
    tp = init_tp_group(rank, size, init_method, config.device)
    ok = False
    try:
        pipeline = LocalPipeline(model_dir, tp, config)
        if not tp.is_driver:
            follow(tp, {i: e for i, e in enumerate(pipeline.engines)})
        else:
            try:
                # Tensors go back by value (numpy): torch would share them through a file descriptor
                # that dies with this process.
                out = [o.numpy() if isinstance(o, torch.Tensor) else o for o in _run_jobs(pipeline, jobs)]
                results.send(("ok", out))
            except Exception as e:  # noqa: BLE001 - reported to the parent, which re-raises
                results.send(("error", f"{type(e).__name__}: {e}"))
            finally:
                pipeline.close()
        ok = True
    finally:
        if not ok and tp.device.type == "cuda":
            traceback.print_exc()  # leave_tp_group's os._exit skips the interpreter's report
        leave_tp_group(tp, ok)  # the result is already sent


def _wait_for_result(receiver, procs: list) -> tuple | None:
    """The driver's (status, payload) as soon as it comes (a large one fills the pipe, and the
    driver blocks until it is read), or None once every rank has exited without one."""
    while True:
        alive = [p.sentinel for p in procs if p.is_alive()]
        if receiver in multiprocessing.connection.wait([receiver, *alive]):
            try:
                return receiver.recv()
            except EOFError:  # every rank closed its end without sending
                return None
        if not alive:
            return None


def run_local(model_dir: str | Path, jobs: list[tuple], config: EngineConfig | None = None) -> list:
    """Run jobs — ("generate", (prompts, sampling)) or ("logits", (prompt,)) — on every stage and
    TP rank of a converted model on this machine (one process per rank when TP > 1)."""
    config = config or EngineConfig()
    tp_size = Manifest.read(model_dir).tp
    if tp_size == 1:
        return _run_jobs(LocalPipeline(model_dir, single_rank(), config), jobs)
    ctx = torch.multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, tp_size, init_method, str(model_dir), config, jobs, sender),
                         daemon=True) for r in range(tp_size)]
    for p in procs:
        p.start()
    sender.close()  # ours: the pipe reads EOF once every rank's copy is closed
    result = _wait_for_result(receiver, procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    if result is None:
        codes = [p.exitcode for p in procs]
        raise RuntimeError(f"TP ranks exited with codes {codes} before returning a result")
    status, out = result
    if status != "ok":
        raise RuntimeError(out)
    return [torch.from_numpy(o) if not isinstance(o, list) else o for o in out]


def generate_local(model_dir: str | Path, prompts: list[list[int]],
                   sampling: SamplingParams | list[SamplingParams], config: EngineConfig | None = None) -> list[list[int]]:
    return run_local(model_dir, [("generate", (prompts, sampling))], config)[0]
