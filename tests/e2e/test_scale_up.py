"""Scale-up: a replica added to a running stage (as `kubectl scale` would) takes new requests as
soon as it is ready, with nothing else told or restarted."""

from __future__ import annotations

import concurrent.futures as cf
import time

import grpc
import pytest

from shardline.client import Client
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.registry import Registry
from shardline.v1 import stage_pb2, stage_pb2_grpc

pytestmark = pytest.mark.slow


def steps(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return stage_pb2_grpc.StageWorkerStub(channel).GetStatus(stage_pb2.StatusRequest(), timeout=5).counters.num_steps


def test_added_stage0_replica_takes_new_requests(tmp_path):
    config = ClusterConfig(pp=2, replicas=1, num_blocks=128, grpc_port=free_port(), workdir=str(tmp_path))
    with LocalCluster(config) as cluster, Client(cluster.gateway_address, timeout=120) as client:
        new = cluster.add_replica(0)
        registry = Registry.from_url(cluster.redis_url)
        deadline = time.monotonic() + 20
        while len(registry.replicas(cluster.model_name, stage=0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {r.address for r in registry.replicas(cluster.model_name, stage=0)} == {
            cluster.stage_addresses[0][0], new}, "the new replica registers itself"
        # The gateway sees it at its next registry poll; bursts of requests from then on spread.
        deadline = time.monotonic() + 20
        with cf.ThreadPoolExecutor(8) as pool:
            while steps(new) == 0 and time.monotonic() < deadline:
                outs = list(pool.map(lambda i: client.generate([1, 5, 9, i + 3], max_tokens=16,
                                                               ignore_eos=True).token_ids, range(8)))
                assert all(len(o) == 16 for o in outs)
        assert steps(new) > 0, "the gateway must route new requests to the added replica"
