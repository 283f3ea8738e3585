"""Benchmark clusters run stage workers on random weights of a built-in shape with a synthetic
tokenizer (benchmarks/e2e_bench.py); the path must serve real requests like any model."""

from __future__ import annotations

import pytest

from shardline.client import Client
from shardline.launcher import ClusterConfig, LocalCluster, free_port

pytestmark = pytest.mark.slow


def test_random_shape_cluster_serves_through_the_gateway(tmp_path):
    config = ClusterConfig(random_shape="llama-small", pp=2, dtype="fp32", grpc_port=free_port(), num_blocks=128,
                           max_model_len=512, workdir=str(tmp_path))
    with LocalCluster(config) as cluster, Client(cluster.gateway_address) as client:
        [model] = client.list_models()
        assert (model.name, model.num_stages, model.max_model_len) == ("llama-small", 2, 512)
        a = client.generate([5, 6, 7, 8], max_tokens=12, temperature=0.0, ignore_eos=True)
        b = client.generate([5, 6, 7, 8], max_tokens=12, temperature=0.0, ignore_eos=True)
        assert len(a.token_ids) == 12 and a.token_ids == b.token_ids, "greedy output must be repeatable"
        assert a.text.split() == [f"w{t}" for t in a.token_ids if t >= 3], "synthetic words decode one per id"
