"""`shardline up --http-port` serves the Triton / KServe-v2 generate route from the gateway process:
a client written for a Triton LLM deployment gets what the SDK gets."""

from __future__ import annotations

import http.client
import json

import pytest

from shardline.client import Client
from shardline.launcher import ClusterConfig, LocalCluster, free_port

pytestmark = pytest.mark.slow


def test_the_v2_generate_route_of_a_cluster_answers_the_sdks_text(tmp_path):
    config = ClusterConfig(pp=2, num_blocks=64, grpc_port=free_port(), http_port=free_port(), workdir=str(tmp_path))
    with LocalCluster(config) as cluster, Client(cluster.gateway_address) as client:
        want = client.generate("Hello there", max_tokens=10, temperature=0.0, ignore_eos=True)
        conn = http.client.HTTPConnection("127.0.0.1", config.http_port, timeout=60)
        conn.request("POST", f"/v2/models/{cluster.model_name}/generate",
                     body=json.dumps({"text_input": "Hello there", "max_tokens": 10, "temperature": 0,
                                      "ignore_eos": True}))
        response = conn.getresponse()
        body = json.loads(response.read())
        conn.request("GET", "/v2/health/ready")
        ready = conn.getresponse()
        ready.read()
        conn.close()
    assert response.status == 200, body
    assert (body["text_output"], body["completion_tokens"], body["model_name"]) == (want.text, 10, cluster.model_name)
    assert ready.status == 200
