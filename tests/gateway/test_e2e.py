"""The gateway in front of real processes: Redis, the tokenizer, 2 replicas of each of 2 stage
workers (PP=2), and `python -m shardline.gateway`, started by the same LocalCluster as `shardline up`.

Greedy tokens through the gateway must equal the engine's; concurrent streams must equal
one-at-a-time; cancelling through the gateway must free KV blocks on every stage; and killing the
stage-0 replica mid-stream must be invisible to the client (same tokens, no gap, no duplicate).
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import grpc
import pytest

from shardline.client import Client, InvalidArgument, OutOfRange
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local
from shardline.v1 import stage_pb2, stage_pb2_grpc

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 13], [1] + list(range(20, 45)), [2, 3], [7] * 9]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = ClusterConfig(pp=2, tp=1, replicas=2, num_blocks=64, grpc_port=free_port(),
                           workdir=str(tmp_path_factory.mktemp("gateway-e2e")))
    with LocalCluster(config) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster.gateway_address, timeout=120) as c:
        yield c


def statuses(cluster) -> list[stage_pb2.StageStatus]:
    out = []
    for addresses in cluster.stage_addresses:
        for address in addresses:
            with grpc.insecure_channel(address) as channel:
                try:
                    out.append(stage_pb2_grpc.StageWorkerStub(channel).GetStatus(stage_pb2.StatusRequest(), timeout=5))
                except grpc.RpcError:
                    pass  # a replica a test killed
    return out


def wait_all_free(cluster, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        s = statuses(cluster)
        if all(x.num_free_blocks == x.num_total_blocks and not x.running_request_ids for x in s):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks not freed on every stage: {s}")
        time.sleep(0.1)


def test_greedy_through_the_gateway_equals_the_engine(cluster, client):
    want = generate_local(cluster.model_dir, PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True),
                          EngineConfig(num_blocks=64))
    got = [client.generate(p, max_tokens=12, temperature=0.0, ignore_eos=True).token_ids for p in PROMPTS]
    assert got == want, "the gateway must deliver exactly the engine's tokens"
    streamed = [[t for d in client.stream(p, max_tokens=12, temperature=0.0, ignore_eos=True) for t in d.token_ids]
                for p in PROMPTS]
    assert streamed == want
    [model] = client.list_models()
    assert (model.num_stages, model.num_routes, model.max_model_len) == (2, 2, 256)


def test_concurrent_streams_equal_one_at_a_time(cluster, client):
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 3] for i in range(32)]
    kwargs = dict(max_tokens=8, temperature=0.8, seed=5, ignore_eos=True)
    alone = [client.generate(p, **kwargs).token_ids for p in prompts]

    def streamed(p):
        return [t for d in client.stream(p, **kwargs) for t in d.token_ids]

    with cf.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(streamed, prompts))
    assert together == alone, "a request's tokens must not depend on what runs beside it"
    assert all(len(t) == 8 for t in together)
    wait_all_free(cluster)


def test_bad_requests_through_the_whole_stack(cluster, client):
    with pytest.raises(InvalidArgument, match="temperature"):
        client.generate("hi", temperature=-1)
    with pytest.raises(OutOfRange, match="context of 256"):
        client.generate([1] * 250, max_tokens=10)
    assert client.generate("hi", max_tokens=1).usage.completion_tokens == 1


def test_cancel_through_the_gateway_frees_kv_on_every_stage(cluster, client):
    stream = client.stream([1, 2, 3], max_tokens=200, ignore_eos=True, request_id="e2e-cancel")
    it = iter(stream)
    next(it)
    held = [s for s in statuses(cluster) if "e2e-cancel" in s.running_request_ids]
    assert len(held) == 2, "both stages of the route should hold the sequence"
    assert client.cancel("e2e-cancel")
    list(it)
    assert stream.finish_reason == "cancelled"
    wait_all_free(cluster)
    assert client.get_request("e2e-cancel").state == "cancelled"
    log = (cluster.logdir / "gateway.log").read_text()
    assert "request e2e-cancel cancelled (cancelled): model " in log, "every request ends with a log line"


def test_killing_the_stage0_replica_mid_stream_is_invisible(cluster, client):
    """Last in the module: it leaves one stage-0 replica dead."""
    prompt = [1, 5, 9, 13]
    want = client.generate(prompt, max_tokens=120, temperature=0.0, ignore_eos=True).token_ids
    got, route = [], None
    stream = client.stream(prompt, max_tokens=120, temperature=0.0, ignore_eos=True, request_id="e2e-kill")
    for delta in stream:
        got.extend(delta.token_ids)
        if len(got) >= 10 and route is None:  # a delta may carry several tokens: >=, once
            route = client.get_request("e2e-kill").route
            replica = cluster.stage_addresses[0].index(route[0])
            cluster.kill(f"stage0-replica{replica}-rank0")
    info = client.get_request("e2e-kill")
    assert got == want, "after a stage-0 replica dies the client must see the same tokens, once each, in order"
    assert info.num_resumes >= 1 and info.route[0] != route[0] and info.state == "finished"
