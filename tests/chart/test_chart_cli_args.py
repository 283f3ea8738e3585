"""Every container the chart renders runs a real shardline command line: its args, expanded as the
kubelet expands them, go through that service's own argparse parser and config checks, and the
parsed values are the ones the chart's values asked for."""

from __future__ import annotations

import argparse

import helm_python
import pytest

from chart_render import CHART, RELEASE, containers, expand, pod_env, render, stage_name
from shardline import cli as shardline_cli
from shardline.gateway.cli import build_parser as gateway_parser
from shardline.gateway.cli import config_from_args as gateway_config
from shardline.stage_worker import server as stage_worker_server
from shardline.tokenizer import __main__ as tokenizer_main

POD_IP = "10.4.2.17"
VALUES = {
    "cuda-pp3-tp2": {"pp": 3, "tp": 2, "device": "cuda", "stages": {"replicasByStage": {"1": 3}, "port": 7100,
                                                                    "tpInitPort": 29611, "metricsPort": 9400,
                                                                    "numBlocks": 900, "maxNumSeqs": 64,
                                                                    "gemmConfig": "tables/gemm-h200.json",
                                                                    "drainTimeoutSeconds": 45, "lazyGraphs": True,
                                                                    "kvCacheDtype": "fp8"},
                     "model": {"path": "llama3-tp2-pp3", "name": "llama3", "maxModelLen": 4096},
                     "gateway": {"port": 50061, "httpPort": 8000, "metricsPort": 9300, "maxQueued": 64},
                     "tokenizer": {"port": 50072},
                     "converter": {"enabled": True, "hfPath": "hf/Meta-Llama-3-8B", "dtype": "fp16",
                                   "weightOnly": "fp8", "stageLayers": "10,12,10", "overwrite": True}},
    "defaults": {},
    "cpu-external-redis": {"device": "cpu", "redis": {"externalUrl": "redis://redis.infra:6379/2"},
                           "model": {"volume": {"persistentVolumeClaim": "", "hostPath": "/srv/models"},
                                     "path": "tiny/tiny-llama-tp1-pp2"}},
}


def merged(values: dict) -> dict:
    """The values a release would use; Helm drops keys whose value is null."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.merge_values(values)


def parse(workload: dict, container: dict):
    """(service, parsed config) for one rendered container, through its service's own parser."""
    env = pod_env(container, POD_IP, f"{workload['metadata']['name']}-0")
    command = [expand(a, env) for a in container.get("command", [])]
    args = [expand(a, env) for a in container.get("args", [])]
    assert not [a for a in command + args if "$(" in a], f"unexpanded variable in {command + args}"
    if command[:2] == ["python", "-m"]:
        module = command[2]
        if module == "shardline.stage_worker":
            return "stage_worker", stage_worker_server.parse_args(args)
        if module == "shardline.gateway":
            return "gateway", gateway_config(gateway_parser().parse_args(args))
        if module == "shardline.tokenizer":
            return "tokenizer", tokenizer_main.config_from_args(tokenizer_main.build_parser().parse_args(args))
    if command[:1] == ["shardline"] and command[1:2] in (["convert"], ["request"]):
        return command[1], shardline_cli.build_parser().parse_args([command[1], *args])
    return None, None


@pytest.mark.parametrize("name", VALUES)
def test_every_container_parses_with_its_service_parser(name):
    values = merged(VALUES[name])
    objects = render(VALUES[name])
    fullname = f"{RELEASE}-shardline"
    redis_url = values["redis"]["externalUrl"] or f"redis://{fullname}-redis:{values['redis']['port']}/0"
    model_dir = f"/models/{values['model']['path']}"
    model_name = values["model"]["name"] or values["model"]["path"].rsplit("/", 1)[-1]
    tp, pp = values["tp"], values["pp"]
    seen: dict[str, list] = {"stage_worker": [], "gateway": [], "tokenizer": [], "convert": [], "request": []}
    for workload, container in containers(objects):
        service, config = parse(workload, container)
        if service is None:
            assert container["name"] == "redis", f"{container['name']} runs no shardline command"
            continue
        seen[service].append((workload, container, config))

    # Stage workers: one parsed config per (stage, rank); the stage and the rank are the pod's.
    ranks = {(c.stage, c.tp_rank): (w, ctr, c) for w, ctr, c in seen["stage_worker"]}
    assert sorted(ranks) == [(s, r) for s in range(pp) for r in range(tp)]
    s = values["stages"]
    for (stage, rank), (workload, container, c) in ranks.items():
        assert workload["metadata"]["name"] == stage_name(stage)
        assert container["name"] == f"rank-{rank}"
        assert (c.model_dir, c.model_name, c.tp_size) == (model_dir, model_name, tp)
        assert c.engine.device == values["device"]
        assert c.drain_timeout_s == s["drainTimeoutSeconds"]
        assert (c.engine.num_blocks, c.engine.max_num_seqs, c.engine.max_model_len) == (
            s.get("numBlocks"), s["maxNumSeqs"], values["model"].get("maxModelLen"))
        assert c.engine.gpu_memory_fraction == s["gpuMemoryFraction"]
        assert c.engine.kv_cache_dtype == s["kvCacheDtype"]
        assert c.engine.gemm_config == (f"/models/{s['gemmConfig']}" if s["gemmConfig"] else None)
        assert c.engine.capture_graphs_at_start is not s["lazyGraphs"]
        assert c.tp_init == (f"tcp://127.0.0.1:{s['tpInitPort']}" if tp > 1 else None)
        if rank == 0:
            assert (c.host, c.port, c.advertise_host) == ("0.0.0.0", s["port"], POD_IP)
            assert c.redis_url == redis_url
            assert c.metrics_port == s.get("metricsPort")
        else:  # followers only compute: no server, no registry
            assert (c.redis_url, c.metrics_port) == (None, None)

    g = values["gateway"]
    assert len(seen["gateway"]) == 1
    _, _, gw = seen["gateway"][0]
    assert gw.redis_url == redis_url
    assert gw.tokenizer == f"{fullname}-tokenizer:{values['tokenizer']['port']}"
    assert (gw.port, gw.http_port, gw.metrics_port) == (g["port"], g.get("httpPort"), g.get("metricsPort"))
    assert gw.model_names == (model_name,)
    assert gw.model_dirs == {model_name: model_dir}
    max_len = values["model"].get("maxModelLen")
    assert gw.max_model_len == ({model_name: max_len} if max_len else {})
    if g.get("maxQueued") is not None:
        assert gw.admission.max_queued == g["maxQueued"]

    assert len(seen["tokenizer"]) == 1
    _, _, tok = seen["tokenizer"][0]
    assert str(tok.model_dir) == model_dir, "the tokenizer reads the files convert copied into the model"
    assert tok.address == f"0.0.0.0:{values['tokenizer']['port']}"

    ((_, _, test),) = seen["request"]  # `helm test`'s pod
    assert (test.gateway, test.model) == (f"{fullname}-gateway:{g['port']}", model_name)

    conv = values["converter"]
    assert len(seen["convert"]) == (1 if conv["enabled"] else 0)
    for _, _, args in seen["convert"]:
        assert isinstance(args, argparse.Namespace)
        assert (args.hf, args.out, args.tp, args.pp, args.dtype) == (
            f"/models/{conv['hfPath']}", model_dir, tp, pp, conv["dtype"])
        assert (args.int8_weight_only, args.fp8_weight_only) == (conv["weightOnly"] == "int8",
                                                                 conv["weightOnly"] == "fp8")
        assert args.stage_layers == (conv["stageLayers"] or None)
        assert args.overwrite is conv["overwrite"]


def test_a_flag_the_stage_worker_lacks_is_refused():
    """The parse above is real: a flag the CLI does not have fails it."""
    with pytest.raises(SystemExit):
        stage_worker_server.parse_args(["--model", "/m", "--stage", "0", "--dtype", "bf16"])
