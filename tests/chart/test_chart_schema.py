"""values.schema.json, run by the real Helm engine: the defaults pass, and each bad value is refused
before anything renders, with a message that names the field."""

from __future__ import annotations

import helm_python
import pytest

from chart_render import CHART, render

NO_VOLUME = {"persistentVolumeClaim": "", "hostPath": ""}

# (values over the defaults, the field the message must name, what it must say about it)
BAD_VALUES = {
    "tp 0": ({"tp": 0}, "/tp", "minimum: got 0, want 1"),
    "pp 0": ({"pp": 0}, "/pp", "minimum: got 0, want 1"),
    "tp not a number": ({"tp": "2"}, "/tp", "got string, want integer"),
    "stage replicas 0": ({"stages": {"replicas": 0}}, "/stages/replicas", "minimum: got 0, want 1"),
    "one stage's replicas 0": ({"stages": {"replicasByStage": {"1": 0}}}, "/stages/replicasByStage/1", "minimum"),
    "a stage that is not an index": ({"stages": {"replicasByStage": {"first": 2}}}, "/stages/replicasByStage",
                                     "additional properties 'first' not allowed"),
    "gateway replicas 0": ({"gateway": {"replicas": 0}}, "/gateway/replicas", "minimum: got 0, want 1"),
    "tokenizer replicas 0": ({"tokenizer": {"replicas": 0}}, "/tokenizer/replicas", "minimum: got 0, want 1"),
    "device tpu": ({"device": "tpu"}, "/device", "value must be one of 'cpu', 'cuda'"),
    "gateway port 0": ({"gateway": {"port": 0}}, "/gateway/port", "minimum: got 0, want 1"),
    "stage port 70000": ({"stages": {"port": 70000}}, "/stages/port", "maximum: got 70,000, want 65,535"),
    "http port 65536": ({"gateway": {"httpPort": 65536}}, "/gateway/httpPort", "maximum"),
    "metrics port 0": ({"stages": {"metricsPort": 0}}, "/stages/metricsPort", "minimum"),
    "tokenizer port -1": ({"tokenizer": {"port": -1}}, "/tokenizer/port", "minimum"),
    "redis port 99999": ({"redis": {"port": 99999}}, "/redis/port", "maximum"),
    "unknown top-level key": ({"replicaCount": 3}, "at ''", "additional properties 'replicaCount' not allowed"),
    "unknown stage key": ({"stages": {"replica": 2}}, "/stages", "additional properties 'replica' not allowed"),
    "no model volume": ({"model": {"volume": NO_VOLUME}}, "/model/volume", "minLength: got 0, want 1"),
    "two model volumes": ({"model": {"volume": {"persistentVolumeClaim": "models", "hostPath": "/srv/models"}}},
                          "/model/volume", "oneOf"),
    "no model path": ({"model": {"path": ""}}, "/model/path", "minLength"),
    "model path outside the volume": ({"model": {"path": "../etc"}}, "/model/path", "does not match pattern"),
    "converter without a checkpoint": ({"converter": {"enabled": True}}, "/converter/hfPath", "minLength"),
    "redis url without a scheme": ({"redis": {"externalUrl": "redis.infra:6379"}}, "/redis/externalUrl", "pattern"),
    "drain timeout 0": ({"stages": {"drainTimeoutSeconds": 0}}, "/stages/drainTimeoutSeconds", "exclusiveMinimum"),
    "kv cache dtype int4": ({"stages": {"kvCacheDtype": "int4"}}, "/stages/kvCacheDtype",
                            "value must be one of 'auto', 'fp8'"),
}


def test_default_values_validate():
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)


@pytest.mark.parametrize("values, field, message", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_rejects_bad_values_naming_the_field(values, field, message):
    with helm_python.Chart.load(CHART) as chart:
        merged = chart.merge_values(values)
        with pytest.raises(helm_python.HelmValuesError) as refused:
            chart.validate_schema(merged)
    text = str(refused.value)
    assert f"at '{field}'" in text or field in text, f"the error must name {field}: {text}"
    assert message in text, text


def test_install_refuses_bad_values_before_rendering():
    """`helm install` validates against the schema too: a bad value never reaches a template."""
    with pytest.raises(helm_python.HelmValuesError, match="/device"):
        render({"device": "tpu"})


def test_either_volume_alone_validates():
    with helm_python.Chart.load(CHART) as chart:
        for volume in ({"persistentVolumeClaim": "models", "hostPath": ""},
                       {"persistentVolumeClaim": "", "hostPath": "/srv/models"}):
            chart.validate_schema(chart.merge_values({"model": {"volume": volume}}))
