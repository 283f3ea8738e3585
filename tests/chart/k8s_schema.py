"""Rendered objects checked against the Kubernetes API's own models (the `kubernetes` client's
generated classes: each field's JSON name and type), since no cluster runs in CI: a misspelt or
misplaced field, a string where an integer belongs, or a missing required field names its path.
What it cannot see is what only an API server checks (value ranges, name formats, admission)."""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client.models as models

# Fields of type Quantity, which the client types as strings but the API server (and kubectl) also
# takes as YAML numbers: `nvidia.com/gpu: 1`.
QUANTITIES = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
              ("V1EmptyDirVolumeSource", "sizeLimit")}
PRIMITIVES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,),
              "datetime": (str,), "date": (str,),
              "quantity": (str, int, float)}


def model_class(api_version: str, kind: str) -> type:
    """apps/v1 StatefulSet -> V1StatefulSet; autoscaling/v2 HorizontalPodAutoscaler -> V2..."""
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    if not hasattr(models, name):
        raise AssertionError(f"{api_version} {kind}: the Kubernetes client has no model {name}")
    return getattr(models, name)


def problems(obj: dict[str, Any]) -> list[str]:
    """Everything in `obj` (one rendered object) that its API model does not allow."""
    out: list[str] = []
    _check(obj, model_class(obj["apiVersion"], obj["kind"]).__name__, obj["kind"], out)
    return out


def _required(cls: type) -> set[str]:
    """JSON names of the model's required fields."""
    return {cls.attribute_map[attr] for attr, f in cls.model_fields.items() if f.is_required()}


def _check(value: Any, type_name: str, path: str, out: list[str]) -> None:
    if value is None:
        return
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            out.append(f"{path}: a list expected, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{path}[{i}]", out)
        return
    if m := re.fullmatch(r"dict\((\w+), (.+)\)|Dict\[(\w+), (.+)\]", type_name):
        if not isinstance(value, dict):
            out.append(f"{path}: a map expected, got {type(value).__name__}")
            return
        for k, v in value.items():
            _check(v, m.group(2) or m.group(4), f"{path}.{k}", out)
        return
    if type_name in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_name]) and not (type_name in ("int", "float") and isinstance(value, bool))
        if not ok:
            out.append(f"{path}: {type_name} expected, got {type(value).__name__} {value!r}")
        return
    cls = getattr(models, type_name)
    if not isinstance(value, dict):
        out.append(f"{path}: an object ({type_name}) expected, got {type(value).__name__}")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            out.append(f"{path}.{key}: no such field in {type_name}")
            continue
        field_type = cls.openapi_types[by_json[key]]
        if (type_name, key) in QUANTITIES:
            field_type = field_type.replace("str", "quantity")
        _check(v, field_type, f"{path}.{key}", out)
    for key in sorted(_required(cls) - set(value)):
        out.append(f"{path}.{key}: required by {type_name}, missing")
