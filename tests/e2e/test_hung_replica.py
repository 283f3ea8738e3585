"""A stage replica that hangs (alive, connected, silent: SIGSTOP) mid-stream loses no request.

Its registry key expires, the gateway breaks the streams routed through it and resumes them on
another route, and the stage-0 replicas that were sending to it keep serving every other route:
their outbound RPCs are ordered per destination, so the calls waiting on the silent replica hold
up nothing else (one ordered queue for all destinations once held the resumed sequences behind
30-second timeouts, and two of six requests ran into their deadline).
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import time

import pytest

from shardline.client import Client
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.registry import Registry
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local

pytestmark = pytest.mark.slow
PROMPTS = [[1, 5, 9, 13 + i] for i in range(6)]


def greedy_streams(client: Client, pool: cf.ThreadPoolExecutor, max_tokens: int) -> list[cf.Future]:
    """One greedy stream a prompt; returns once every stream has its first two tokens (running on
    a replica, not on its way to one)."""
    running: set[int] = set()

    def stream(i: int) -> list[int]:
        out = []
        for d in client.stream(PROMPTS[i], max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
            out.extend(d.token_ids)
            if len(out) >= 2:
                running.add(i)
        return out

    futures = [pool.submit(stream, i) for i in range(len(PROMPTS))]
    deadline = time.monotonic() + 60
    while len(running) < len(PROMPTS) and time.monotonic() < deadline:
        time.sleep(0.01)
    return futures


def test_a_silent_stage1_replica_mid_stream_loses_no_request(tmp_path):
    config = ClusterConfig(pp=2, replicas=2, num_blocks=128, grpc_port=free_port(), workdir=str(tmp_path))
    with LocalCluster(config) as cluster, Client(cluster.gateway_address, timeout=60) as client:
        sampling = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
        want = generate_local(cluster.model_dir, PROMPTS, sampling, EngineConfig(num_blocks=128))
        victim = cluster.process("stage1-replica0-rank0")
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = greedy_streams(client, pool, max_tokens=120)
            victim.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                got = [f.result(timeout=60) for f in futures]
                took = time.monotonic() - started
            finally:
                victim.send_signal(signal.SIGCONT)
        assert got == want, "a silent replica changed or lost tokens"
        assert "vanished from the registry" in (cluster.logdir / "gateway.log").read_text(), \
            "this case is about streams broken by a replica that went silent"
        assert took < 30, f"the resumed streams took {took:.0f}s: something waited on the silent replica"


def test_a_stage0_replica_that_wakes_up_after_its_streams_resumed_corrupts_nothing(tmp_path):
    """Two stage-0 replicas share the one stage-1 replica. Stage 0 #0 goes silent mid-stream; its
    streams resume through #1 with the same request ids. Then #0 wakes up and goes on sending what
    it had queued (micro-batches, then frees) for those ids. Stage 0 names each attempt by a key
    of its own down the route, so stage 1 keeps the two attempts' KV caches apart: the resumed
    streams come out exactly as an undisturbed run (before, two of six came out wrong)."""
    config = ClusterConfig(pp=2, replicas=1, num_blocks=256, grpc_port=free_port(), workdir=str(tmp_path))
    with LocalCluster(config) as cluster, Client(cluster.gateway_address, timeout=90) as client:
        cluster.add_replica(0)
        sampling = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True)
        want = generate_local(cluster.model_dir, PROMPTS, sampling, EngineConfig(num_blocks=256))
        victim = cluster.process("stage0-replica0-rank0")
        gateway_log = cluster.logdir / "gateway.log"
        deadline = time.monotonic() + 30  # both stage-0 replicas registered and routable
        while len(Registry.from_url(cluster.redis_url).replicas(cluster.model_name, stage=0)) < 2 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = greedy_streams(client, pool, max_tokens=240)
            victim.send_signal(signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 30
                while "vanished from the registry" not in gateway_log.read_text() and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.5)  # the resumed attempts run on stage 1 ...
            finally:
                victim.send_signal(signal.SIGCONT)  # ... when the old ones' traffic arrives there
            got = [f.result(timeout=90) for f in futures]
        assert "vanished from the registry" in gateway_log.read_text(), "this case is about resumed streams"
        assert got == want, "a stage-0 replica waking up must not change the resumed streams' tokens"
