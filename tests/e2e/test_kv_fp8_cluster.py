"""`shardline up --kv-cache-dtype fp8` reaches every stage worker process: the cluster serves
the in-process engine's fp8-cache tokens through the gateway."""

from __future__ import annotations

import pytest

from shardline.client import Client
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local

pytestmark = pytest.mark.slow


def test_a_cluster_with_fp8_caches_serves_the_engines_tokens(tmp_path):
    config = ClusterConfig(pp=2, num_blocks=64, kv_cache_dtype="fp8", grpc_port=free_port(), workdir=str(tmp_path))
    prompt = [1, 5, 9, 13, 2, 7]
    with LocalCluster(config) as cluster, Client(cluster.gateway_address) as client:
        got = client.generate(prompt, max_tokens=12, temperature=0.0, ignore_eos=True).token_ids
        logs = [p.read_text() for p in cluster.logdir.glob("stage*")]
        want = generate_local(cluster.model_dir, [prompt], SamplingParams(max_tokens=12, ignore_eos=True),
                              EngineConfig(num_blocks=64, kv_cache_dtype="fp8"))[0]
    assert got == want
    assert len(logs) == 2 and all("KV cache (float8_e4m3fn, no scales) of 64 blocks" in text for text in logs), logs
