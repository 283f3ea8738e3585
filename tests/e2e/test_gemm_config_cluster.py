"""`shardline up --gemm-config` reaches every stage worker process, as an absolute path (the
workers run elsewhere): a CPU stage worker says it does not read it, a GPU one loads it and runs
its decode rows on the table's kernel. Either way the cluster serves the in-process engine's
tokens on the same table."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from gemm_tables import gemm_table

from shardline.client import Client
from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[1, 5, 9, 13, 2, 7], [1, 17, 42, 99], [2, 9], [1, 100, 200] * 3]


def serve(config: ClusterConfig, engine: EngineConfig) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """Every prompt at once through the gateway (decode steps of several rows), the in-process
    engine's tokens for them, and the stage workers' logs."""
    with LocalCluster(config) as cluster, Client(cluster.gateway_address) as client:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda p: client.generate(p, max_tokens=16, temperature=0.0,
                                                          ignore_eos=True).token_ids, PROMPTS))
        logs = [p.read_text() for p in sorted(cluster.logdir.glob("stage*"))]
        want = generate_local(cluster.model_dir, PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True), engine)
    return got, want, logs


def test_every_stage_worker_is_given_the_table(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the path as a user gives it, relative to where they run `shardline up`
    table = "benchmarks/results/gemm-h200-decode.json"
    config = ClusterConfig(pp=2, num_blocks=64, gemm_config=table, grpc_port=free_port(), workdir=str(tmp_path))
    assert config.gemm_config == str(REPO / table)
    got, want, logs = serve(config, EngineConfig(num_blocks=64))
    assert got == want
    said = [f"stage {s} rank 0: GEMM config {REPO / table} not read: its tables choose GPU kernels, and on cpu "
            "torch runs every linear" for s in (0, 1)]
    assert len(logs) == 2 and all(line in text for line, text in zip(said, logs)), logs


@pytest.mark.gpu
def test_gpu_stage_workers_load_the_table_and_serve_its_tokens(tmp_path, tiny_hf):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; the CPU test above covers the flag's path to every stage worker")
    from shardline.converter import convert

    model = tmp_path / "tiny"
    convert(tiny_hf(), model, tp=1, pp=2, dtype="fp32")
    table = gemm_table(model, tmp_path / "gemm.json", torch.float32, {"impl": "triton", "config": dict(
        BLOCK_N=32, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=3)})
    config = ClusterConfig(model=str(model), pp=2, device="cuda", num_blocks=64, gemm_config=table,
                           grpc_port=free_port(), workdir=str(tmp_path / "cluster"))
    got, want, logs = serve(config, EngineConfig(device="cuda", num_blocks=64, gemm_config=table))
    assert got == want
    said = [f"stage {s} rank 0: GEMM config {table} ({torch.cuda.get_device_name()}): entries at 64 rows"
            for s in (0, 1)]
    assert len(logs) == 2 and all(line in text for line, text in zip(said, logs)), logs
