"""The stage-0 worker loop without gRPC: admission, streaming events, cancel, overlapped decode."""

from __future__ import annotations

import queue
import time

import pytest

from shardline.config import EngineConfig
from shardline.converter import convert
from shardline.parallel import single_rank
from shardline.sampling import SamplingParams
from shardline.stage_worker.engine import StageEngine
from shardline.stage_worker.pipeline import LocalPipeline
from shardline.stage_worker.sequence import FinishReason
from shardline.stage_worker.worker import AdmissionError, StageWorker
from shardline.tiny import make_tiny_hf_model

PROMPTS = [[1, 5, 9], [1] + list(range(10, 30)), [2], [7] * 9]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker")
    convert(make_tiny_hf_model(root / "hf", "llama", seed=5), root / "model", tp=1, pp=1, dtype="fp32")
    return root / "model"


def drain(events: queue.Queue, timeout_s: float = 30) -> list:
    out = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        e = events.get(timeout=timeout_s)
        out.append(e)
        if e.finish_reason is not None:
            return out
    raise AssertionError("stream did not finish")


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])
def test_worker_streams_the_engine_tokens_and_cancel_frees(model, overlap):
    config = EngineConfig(num_blocks=64, overlap_decode=overlap)
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    want = LocalPipeline(model, config=EngineConfig(num_blocks=64)).generate(PROMPTS, sampling)
    worker = StageWorker(StageEngine(model, 0, single_rank(), config), "local", "r0", "tiny")
    try:
        assert (worker.stepper is not None) == overlap
        streams = [worker.admit(f"r{i}", p, sampling, [], []) for i, p in enumerate(PROMPTS)]
        got = [drain(s) for s in streams]
        assert [[e.token_id for e in g] for g in got] == want
        assert all(g[-1].finish_reason is FinishReason.LENGTH for g in got)
        assert [e.index for e in got[1]] == list(range(12)), "indices must have no gap or duplicate"

        long = worker.admit("long", PROMPTS[1], SamplingParams(max_tokens=200, ignore_eos=True), [], [])
        long.get(timeout=30)
        worker.cancel("long")
        assert drain(long)[-1].finish_reason is FinishReason.CANCELLED
        deadline = time.monotonic() + 10
        while worker.status()["free_blocks"] != 64 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.status()["free_blocks"] == 64, "cancel must free the sequence's KV blocks"
        with pytest.raises(AdmissionError, match="outside the vocabulary"):
            worker.admit("bad", [1, 10**6], sampling, [], [])
    finally:
        worker.stop()


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_overlapped_worker_gives_back_every_block_of_short_requests(model, max_tokens):
    """Prompts prefilled in chunks, outputs of a few tokens, the pattern that leaked KV blocks in
    the in-process pipeline (test_batching): the worker frees finished requests after each
    delivery, and every block comes back, round after round."""
    config = EngineConfig(num_blocks=64, overlap_decode=True, max_num_batched_tokens=32)
    worker = StageWorker(StageEngine(model, 0, single_rank(), config), "local", "r0", "tiny")
    try:
        assert worker.stepper is not None
        for round_ in range(3):
            streams = [worker.admit(f"s{round_}-{i}", [1 + i] * 16, SamplingParams(max_tokens=max_tokens,
                                                                                   ignore_eos=True), [], [])
                       for i in range(8)]
            assert all(len(drain(s)) == max_tokens for s in streams)
            deadline = time.monotonic() + 10
            while worker.status()["free_blocks"] != 64 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert worker.status()["free_blocks"] == 64, f"round {round_}: finished requests still hold KV blocks"
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker2")
    convert(make_tiny_hf_model(root / "hf", "llama", seed=6), root / "model", tp=1, pp=2, dtype="fp32")
    return root / "model"


def test_downstream_stage_frees_sequences_whose_stage0_vanished(two_stage):
    """If stage 0 dies, no Free reaches stage 1: its KV blocks must still come back."""
    import torch

    from shardline.stage_worker.convert import batch_to_proto
    from shardline.stage_worker.batch import SequenceChunk, StageBatch
    from shardline.v1 import common_pb2, stage_pb2
    from shardline.wire import tensor_to_bytes

    engine = StageEngine(two_stage, 1, single_rank(), EngineConfig(num_blocks=32))
    worker = StageWorker(engine, "local", "r1", "tiny", orphan_timeout_s=0.3)
    try:
        batch = StageBatch([SequenceChunk("orphan", 0, 5, True, SamplingParams(max_tokens=4))])
        data, shape, dtype = tensor_to_bytes(torch.zeros(5, engine.model_config.hidden_size))
        msg = stage_pb2.MicroBatch(micro_batch_id=1, origin="127.0.0.1:1", sequences=batch_to_proto(batch),
                                   hidden=common_pb2.Tensor(data=data, shape=shape, dtype=dtype))
        worker.forward(msg)
        deadline = time.monotonic() + 5
        while "orphan" not in worker.status()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "orphan" in worker.status()["running"]
        while worker.status()["free_blocks"] != 32 and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert worker.status()["free_blocks"] == 32, "orphaned sequences must give their blocks back"
    finally:
        worker.stop()


def test_rank_device_gives_each_tp_rank_its_own_gpu(monkeypatch):
    import torch

    from shardline.parallel import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [rank_device("cuda", r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert rank_device("cuda:1", 0) == "cuda:1" and rank_device("cpu", 3) == "cpu"


def test_metrics_endpoint_reports_the_worker(model):
    import urllib.request

    from shardline.launcher import free_port
    from shardline.stage_worker.metrics import serve_metrics

    worker = StageWorker(StageEngine(model, 0, single_rank(), EngineConfig(num_blocks=64)), "local", "r0", "tiny")
    port = free_port()
    server, thread = serve_metrics(worker, port, "127.0.0.1")
    try:
        drain(worker.admit("m1", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True), [], []))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        labels = 'model="tiny",replica="r0",stage="0"'
        assert f"shardline_kv_blocks_total{{{labels}}} 64.0" in text
        steps = [l for l in text.splitlines() if l.startswith("shardline_stage_steps_total{")]
        assert steps and float(steps[0].split()[-1]) >= 5, "five tokens take at least five steps"
    finally:
        server.shutdown()
        worker.stop()
