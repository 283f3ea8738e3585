"""Gateways scale out: several gateway processes share Redis and the stage workers, as the chart's
gateway Deployment does with `replicas` (one gateway process carries ~10,000 streamed tokens/s),
and each of them answers for the requests another one runs."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from shardline.client import Client
from shardline.launcher import ClusterConfig, LocalCluster, free_port_run

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 4], [1, 22, 7], [3] * 11, [1, 2, 3, 4, 5, 6]]


def test_two_gateways_share_the_stages_and_each_others_requests(tmp_path):
    config = ClusterConfig(pp=2, gateways=2, num_blocks=128, grpc_port=free_port_run(2), workdir=str(tmp_path))
    with LocalCluster(config) as cluster:
        a_address, b_address = cluster.gateway_addresses
        assert b_address.endswith(f":{config.grpc_port + 1}")
        with Client(a_address, timeout=120) as a, Client(b_address, timeout=120) as b:
            want = [a.generate(p, max_tokens=12, temperature=0.0, ignore_eos=True).token_ids for p in PROMPTS]
            assert all(len(w) == 12 for w in want)

            # Concurrent requests through both gateways get what one gateway alone gave.
            def through(i: int) -> list[int]:
                return (a, b)[i % 2].generate(PROMPTS[i % 4], max_tokens=12, temperature=0.0, ignore_eos=True).token_ids

            with cf.ThreadPoolExecutor(8) as pool:
                got = list(pool.map(through, range(16)))
            assert got == [want[i % 4] for i in range(16)]

            # b reads the record of a request a ran, and cancels one a is running.
            done = a.generate(PROMPTS[0], max_tokens=3, ignore_eos=True)
            info = b.get_request(done.request_id)
            assert (info.state, info.num_generated_tokens) == ("finished", 3)
            stream = a.stream([1, 2, 3], max_tokens=200, ignore_eos=True, request_id="two-gateways-cancel")
            it = iter(stream)
            next(it)
            assert b.cancel("two-gateways-cancel"), "a cancel reaches the gateway that runs the request"
            list(it)
            assert stream.finish_reason == "cancelled"
            assert b.get_request("two-gateways-cancel").state == "cancelled"

            # One gateway gone, the other serves on.
            cluster.kill("gateway")
            assert b.generate(PROMPTS[1], max_tokens=12, temperature=0.0, ignore_eos=True).token_ids == want[1]
