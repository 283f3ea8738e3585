"""`shardline up --gemm-config` reaches every stage worker process, as an absolute path (the
workers run elsewhere), and a CPU stage worker says it does not read it: the cluster serves the
in-process engine's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.client import Client
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_every_stage_worker_is_given_the_table(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the path as a user gives it, relative to where they run `shardline up`
    table = "benchmarks/results/gemm-h200-decode.json"
    config = ClusterConfig(pp=2, num_blocks=64, gemm_config=table, grpc_port=free_port(), workdir=str(tmp_path))
    assert config.gemm_config == str(REPO / table)
    prompt = [1, 5, 9, 13, 2, 7]
    with LocalCluster(config) as cluster, Client(cluster.gateway_address) as client:
        got = client.generate(prompt, max_tokens=8, temperature=0.0, ignore_eos=True).token_ids
        logs = [p.read_text() for p in sorted(cluster.logdir.glob("stage*"))]
        want = generate_local(cluster.model_dir, [prompt], SamplingParams(max_tokens=8, ignore_eos=True),
                              EngineConfig(num_blocks=64))[0]
    assert got == want
    said = [f"stage {s} rank 0: GEMM config {REPO / table} not read: its tables choose GPU kernels, and on cpu "
            "torch runs every linear" for s in (0, 1)]
    assert len(logs) == 2 and all(line in text for line, text in zip(said, logs)), logs
