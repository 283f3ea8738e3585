"""A kubelet in a test: the chart rendered for CPU and PP=2, each rendered pod started as real local
processes from exactly its containers' command, args and env, and one real Generate request sent
through the gateway. What the cluster would provide is mapped onto this machine and nothing else:
a Service's name becomes 127.0.0.1 and the port of the pod it selects, a pod's IP is 127.0.0.1 and
each pod's ports (its container ports and its loopback ports) get free local ports of their own,
the hostPath model volume is its directory. If the chart wires a flag, a port, a Service or a
probe wrongly, no token comes back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from chart_render import NAMESPACE, expand, helm_test_pods, of_kind, pod_env, pod_spec, render, selects, workloads
from shardline.client import Client
from shardline.converter import convert
from shardline.launcher import free_port, wait_healthy

pytestmark = pytest.mark.slow

MODEL_NAME = "chart-tiny-llama"  # distinct from other tests' models in the shared Redis
STARTUP_TIMEOUT_S = 60.0


@dataclass
class Pod:
    name: str
    labels: dict[str, str]
    spec: dict
    ports: dict[int, int] = field(default_factory=dict)  # port in the pod -> local port


def make_pods(objects: list[dict]) -> list[Pod]:
    """One pod per workload (the test renders one replica of each), each with a local port for
    every container port and every 127.0.0.1:PORT its args name (the pod's own loopback)."""
    pods = []
    for w in workloads(objects):
        assert w["kind"] != "Job" and w["spec"].get("replicas", 1) == 1
        pod = Pod(f"{w['metadata']['name']}-0", w["spec"]["template"]["metadata"]["labels"], pod_spec(w))
        for c in pod.spec["containers"]:
            own = [p["containerPort"] for p in c.get("ports", [])]
            own += [int(p) for a in c.get("args", []) for p in re.findall(r"127\.0\.0\.1:(\d+)", a)]
            for port in own:
                pod.ports.setdefault(port, free_port())
        pods.append(pod)
    return pods


def service_addresses(objects: list[dict], pods: list[Pod]) -> dict[str, str]:
    """'<service>:<port>' (and the namespaced forms of the name) -> '127.0.0.1:<local port>' of the
    pod the Service selects, through its targetPort (a name or a number)."""
    addresses = {}
    for svc in of_kind(objects, "Service").values():
        (pod,) = [p for p in pods if selects(svc["spec"]["selector"], p.labels)]
        declared = [p for c in pod.spec["containers"] for p in c.get("ports", [])]
        name = svc["metadata"]["name"]
        for sp in svc["spec"]["ports"]:
            (target,) = [p["containerPort"] for p in declared if sp["targetPort"] in (p.get("name"), p["containerPort"])]
            for host in (name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"):
                addresses[f"{host}:{sp['port']}"] = f"127.0.0.1:{pod.ports[target]}"
    return addresses


def local_command(pod: Pod, container: dict, services: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The container's command line and env as they run on this machine."""
    env = pod_env(container, "127.0.0.1", pod.name)
    mounts = {}
    for m in container.get("volumeMounts", []):
        (volume,) = [v for v in pod.spec["volumes"] if v["name"] == m["name"]]
        if "hostPath" in volume:
            mounts[m["mountPath"]] = volume["hostPath"]["path"]
    container_ports = {p["containerPort"] for p in container.get("ports", [])}
    out = []
    for i, arg in enumerate([expand(a, env) for a in container["command"] + container["args"]]):
        for service, local in services.items():
            arg = re.sub(rf"\b{re.escape(service)}\b", local, arg)
        arg = re.sub(r"(127\.0\.0\.1|0\.0\.0\.0):(\d+)",
                     lambda m: f"{m.group(1)}:{pod.ports.get(int(m.group(2)), int(m.group(2)))}", arg)
        # A flag's bare port number (--port 7000); no other flag of these pods takes such a number.
        if arg.isdigit() and int(arg) in container_ports and out[-1].startswith("--"):
            arg = str(pod.ports[int(arg)])
        for mount_path, host_path in mounts.items():
            if arg == mount_path or arg.startswith(mount_path + "/"):
                arg = host_path + arg[len(mount_path):]
        out.append(arg)
    if out[0] == "shardline":  # the console script of the image's shardline install
        return [sys.executable, "-m", "shardline.cli", *out[1:]], env
    assert out[:2] == ["python", "-m"], out
    return [sys.executable, *out[1:]], env


def readiness_address(pod: Pod, container: dict) -> str | None:
    probe = container.get("readinessProbe", {}).get("grpc")
    return None if probe is None else f"127.0.0.1:{pod.ports[probe['port']]}"


# tp=2: each stage pod's second rank joins rank 0 on the pod's loopback (gloo on CPU).
@pytest.mark.parametrize("tp", [1, 2])
def test_rendered_pods_serve_a_request(tp, tmp_path, redis_server, tiny_hf):
    volume = tmp_path / "volume"
    model_path = f"tiny-llama-tp{tp}-pp2"
    convert(tiny_hf("llama"), volume / model_path, tp=tp, pp=2, dtype="fp32")
    values = {"device": "cpu", "pp": 2, "tp": tp,
              "model": {"volume": {"persistentVolumeClaim": "", "hostPath": str(volume)},
                        "path": model_path, "name": f"{MODEL_NAME}-tp{tp}"},
              "stages": {"numBlocks": 64, "drainTimeoutSeconds": 5},
              # Named "localhost": a 127.0.0.1 in a pod's args is that pod's own loopback, and
              # this Redis lives outside every pod.
              "redis": {"externalUrl": redis_server.replace("127.0.0.1", "localhost")}}
    objects = render(values)
    pods = make_pods(objects)
    services = service_addresses(objects, pods)
    assert sorted(p.name for p in pods) == sorted(
        f"demo-shardline-{n}-0" for n in ("gateway", "tokenizer", "stage-0", "stage-1"))

    procs: list[tuple[str, subprocess.Popen]] = []
    try:
        ready = []
        for pod in pods:
            for container in pod.spec["containers"]:
                cmd, env = local_command(pod, container, services)
                name = f"{pod.name}-{container['name']}"
                log = open(tmp_path / f"{name}.log", "w")
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
                procs.append((name, proc))
                if (address := readiness_address(pod, container)) is not None:
                    ready.append((address, proc, name))
        assert len(procs) == 2 + 2 * tp, "a container per TP rank in each stage pod"
        assert len(ready) == 4, "the gateway, the tokenizer and both stages' rank 0 have gRPC readiness"
        # The kubelet's readiness probes: the gateway turns SERVING only once both stages registered.
        for address, proc, name in ready:
            wait_healthy(address, STARTUP_TIMEOUT_S, proc, name)
        with Client(services["demo-shardline-gateway:50051"], timeout=30) as client:
            result = client.generate("Hello", model=f"{MODEL_NAME}-tp{tp}", max_tokens=4, ignore_eos=True, temperature=0.0)
        assert len(result.token_ids) == 4, "tokens must come back through stage 0, stage 1 and the gateway"
        # `helm test`: its pod's command, run once; its exit status is the verdict.
        (test,) = helm_test_pods(objects)
        pod = Pod(test["metadata"]["name"], test["metadata"]["labels"], test["spec"])
        cmd, env = local_command(pod, test["spec"]["containers"][0], services)
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert run.returncode == 0, f"helm test failed: {run.stderr}"
        # The kubelet's stop: SIGTERM to every container at once (followers included), and each
        # must exit cleanly within its grace period.
        for _, proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(timeout=30) for name, proc in procs}
        assert set(codes.values()) == {0}, f"every container exits 0 on SIGTERM: {codes}"
    except BaseException:
        for name, _ in procs:
            print(f"--- {name}\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")
        raise
    finally:
        for _, proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for _, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
