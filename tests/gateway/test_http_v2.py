"""The Triton / KServe-v2 routes of the HTTP front door (health, metadata, the generate extension),
over a real socket with the stdlib HTTP client, against the same gateway the gRPC API drives."""

from __future__ import annotations

import threading

from shardline.client import Client
from shardline.gateway.config import AdmissionConfig
from test_http import post, sse


def test_generate_and_generate_stream_answer_what_the_sdk_gets(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0)
    port = gw.http_port
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        want = client.generate("hello world", max_tokens=12, temperature=0.0)
    status, _, body = post(port, f"/v2/models/{model_name}/generate",
                           {"text_input": "hello world", "max_tokens": 12, "temperature": 0})
    assert status == 200, body
    assert body == {"model_name": model_name, "model_version": "1", "text_output": want.text, "finish_reason": "length",
                    "prompt_tokens": want.usage.prompt_tokens, "completion_tokens": 12}
    # the inputs in "parameters", and text_input as a BYTES tensor of one element, as some clients send them
    status, _, body = post(port, f"/v2/models/{model_name}/generate",
                           {"text_input": ["hello world"], "parameters": {"max_tokens": 12, "temperature": 0.0}})
    assert status == 200 and body["text_output"] == want.text

    events = sse(port, f"/v2/models/{model_name}/generate_stream",
                        {"text_input": "hello world", "max_tokens": 12, "temperature": 0})
    assert all(e["model_name"] == model_name and e["model_version"] == "1" for e in events)
    assert "".join(e["text_output"] for e in events) == want.text
    assert events[-1]["finish_reason"] == "length" and events[-1]["completion_tokens"] == 12
    assert not any("finish_reason" in e for e in events[:-1])


def test_health_and_metadata(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0)
    port = gw.http_port
    assert post(port, "/v2/health/live", None, method="GET")[0] == 200
    assert post(port, "/v2/health/ready", None, method="GET")[:3:2] == (200, {"ready": True})
    status, _, server = post(port, "/v2", None, method="GET")
    assert status == 200 and server["name"] == "shardline" and server["extensions"] == ["generate"]
    status, _, meta = post(port, f"/v2/models/{model_name}", None, method="GET")
    assert status == 200 and meta["name"] == model_name and meta["versions"] == ["1"]
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "max_tokens", "temperature", "stop"}
    assert [i for i in meta["inputs"] if not i["optional"]] == [{"name": "text_input", "datatype": "BYTES",
                                                                 "shape": [1], "optional": False}]
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]
    assert post(port, f"/v2/models/{model_name}/ready", None, method="GET")[:3:2] == (200, {"name": model_name,
                                                                                           "ready": True})


def test_no_route_is_not_ready(bench, model_name):
    bench.add_replica(model_name, 0)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0, route_wait_s=0.1)
    assert post(gw.http_port, "/v2/health/ready", None, method="GET")[0] == 503
    assert post(gw.http_port, "/v2/health/live", None, method="GET")[0] == 200
    status, _, error = post(gw.http_port, f"/v2/models/{model_name}/generate", {"text_input": "hi"})
    assert status == 503 and "stage [1]" in error["error"]


def test_bad_requests_are_refused_in_the_v2_form_naming_the_fix(bench, model_name):
    bench.route(model_name, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0,
                             admission=AdmissionConfig(max_running=1, max_queued=0))
    port, path = gw.http_port, f"/v2/models/{model_name}/generate"
    cases = [({"max_tokens": 4}, 400, 'text_input is required, e.g. {"text_input": "Hello"'),
             ({"text_input": "", "max_tokens": 4}, 400, "text_input is empty: send some text"),
             ({"text_input": [""]}, 400, "text_input is empty: send some text"),
             ({"text_input": "hi", "max_new_tokens": 4}, 400,
              "unknown input(s) max_new_tokens; the generate route takes text_input, max_tokens"),
             ({"text_input": "hi", "max_tokens": "4"}, 400, 'max_tokens must be an integer, got "4"'),
             ({"text_input": "hi", "ignore_eos": 1}, 400, "ignore_eos must be true or false, got 1"),
             ({"text_input": ["a", "b"]}, 400, "text_input must be a string (or a list of one)"),
             ({"text_input": "hi", "stop": ["a", 3]}, 400, "stop must be a string or a list of strings"),
             ({"text_input": "hi", "max_tokens": 4, "parameters": {"max_tokens": 5}}, 400,
              "max_tokens given both as an input and in parameters; give each once"),
             ({"text_input": "hi", "seed": 1, "random_seed": 2}, 400, "seed and random_seed are one input"),
             ({"text_input": "hi", "parameters": [1]}, 400, "parameters must be an object"),
             ({"text_input": "hi", "temperature": -1}, 400, "temperature -1"),
             ({"text_input": "hi", "max_tokens": 0}, 400, "max_tokens 0"),
             ([1, 2], 400, "the request body must be a JSON object")]
    for body, status, needle in cases:
        got, _, error = post(port, path, body)
        assert got == status and isinstance(error["error"], str) and needle in error["error"], (body, got, error)
    got, _, error = post(port, "/v2/models/nope/generate", {"text_input": "hi"})
    assert got == 404 and "model 'nope' is unknown" in error["error"]
    got, _, error = post(port, "/v2/models/nope", None, method="GET")
    assert got == 404 and "model 'nope' is unknown" in error["error"]
    got, _, error = post(port, path, b"{not json")
    assert got == 400 and "not JSON" in error["error"]
    got, _, error = post(port, path, None, method="GET")
    assert got == 405 and "use POST" in error["error"]
    got, _, error = post(port, "/v2/nothing", None, method="GET")
    assert got == 404 and "/v2/models/{model}" in error["error"]

    threading.Thread(target=lambda: post(port, path, {"text_input": "x", "max_tokens": 20})).start()
    bench.wait_until(lambda: gw.gateway.admission.num_running == 1, what="a running request")
    got, headers, error = post(port, path, {"text_input": "hi", "max_tokens": 2})
    assert got == 429 and int(headers["Retry-After"]) >= 1 and "max_running 1" in error["error"]
    # and the gateway keeps serving
    bench.wait_until(lambda: gw.gateway.admission.num_running == 0, what="the running request to finish")
    got, _, body = post(port, path, {"text_input": "hi", "max_tokens": 2})
    assert got == 200 and body["completion_tokens"] == 2
