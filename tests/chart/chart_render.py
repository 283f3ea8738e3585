"""The chart rendered by the real Helm engine (helm_python: Helm v4's Go SDK through ctypes), as
plain Kubernetes objects the tests can walk: workloads, their pod specs, Services, selectors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import helm_python
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "shardline"
RELEASE = "demo"
NAMESPACE = "serving"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> list[dict[str, Any]]:
    """Every object the chart renders with `values` over its defaults (hooks included), NOTES.txt
    left out. Raises helm_python.HelmError on bad values or a template that fails."""
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=release, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    return manifests["shardline/templates/NOTES.txt"]


def of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workloads(objects: list[dict]) -> Iterator[dict]:
    return (o for o in objects if o["kind"] in WORKLOAD_KINDS)


def helm_test_pods(objects: list[dict]) -> list[dict]:
    """The pods `helm test` runs (the "test" hook)."""
    return [o for o in objects
            if o["kind"] == "Pod" and o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def pod_spec(obj: dict) -> dict:
    """The pod spec of a workload's template, or of a bare Pod."""
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def containers(objects: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload or test pod, container) for every container the release runs."""
    for w in [*workloads(objects), *helm_test_pods(objects)]:
        for c in pod_spec(w)["containers"]:
            yield w, c


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def selected_workloads(service: dict, objects: list[dict]) -> list[dict]:
    """The workloads whose pods `service` selects."""
    return [w for w in workloads(objects)
            if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]


def stage_name(stage: int, release: str = RELEASE) -> str:
    return f"{release}-shardline-stage-{stage}"


def flag(args: list[str], name: str) -> str:
    """The value after `name` in args; fails the test when the flag is missing or repeated."""
    positions = [i for i, a in enumerate(args) if a == name]
    assert len(positions) == 1, f"{name} appears {len(positions)} times in {args}"
    return args[positions[0] + 1]


def pod_env(container: dict, pod_ip: str, pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet resolves it for a pod at `pod_ip`."""
    fields = {"status.podIP": pod_ip, "metadata.name": pod_name}
    env = {}
    for e in container.get("env", []):
        env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in e else e["value"]
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args: a defined variable is replaced, "$$" is a
    literal "$", anything else stays as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)
