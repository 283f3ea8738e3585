"""Every object the chart renders, in each rendering the wiring tests use, is one the Kubernetes API
accepts by its own models (k8s_schema: field names, types, required fields); and the check itself
catches the mistakes a template makes."""

from __future__ import annotations

import copy

import pytest

from chart_render import render
from k8s_schema import problems
from test_chart_render import RENDERINGS


@pytest.mark.parametrize("values", list(RENDERINGS.values()), ids=list(RENDERINGS))
def test_every_rendered_object_fits_its_api_model(values):
    found = {f"{o['kind']}/{o['metadata']['name']}": problems(o) for o in render(values)}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_names_a_misspelt_field_a_wrong_type_and_a_missing_one():
    stage = next(o for o in render() if o["kind"] == "StatefulSet")
    broken = copy.deepcopy(stage)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinessprobe"] = container.pop("readinessProbe")
    container["ports"][0]["containerPort"] = str(container["ports"][0]["containerPort"])
    del container["name"]
    broken["spec"]["template"]["spec"]["restartPolicy"] = ["Always"]
    path = "StatefulSet.spec.template.spec"
    assert sorted(problems(broken)) == sorted([
        f"{path}.containers[0].readinessprobe: no such field in V1Container",
        f"{path}.containers[0].ports[0].containerPort: int expected, got str "
        f"{container['ports'][0]['containerPort']!r}",
        f"{path}.containers[0].name: required by V1Container, missing",
        f"{path}.restartPolicy: str expected, got list ['Always']",
    ])
    assert problems(stage) == []
