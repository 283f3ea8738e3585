"""The OpenAI-compatible HTTP front door, over a real socket with the stdlib HTTP client."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

from shardline.client import Client
from shardline.gateway.config import AdmissionConfig



def post(port: int, path: str, body, method: str = "POST"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=json.dumps(body) if not isinstance(body, (bytes, str)) else body,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), json.loads(data) if data else None


def sse(port: int, path: str, body) -> list:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    events = []
    for line in response:
        line = line.decode().strip()
        if line.startswith("data: "):
            events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    conn.close()
    return events


def test_completions_models_and_chat(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0)
    port = gw.http_port
    status, _, models = post(port, "/v1/models", None, method="GET")
    assert status == 200 and [m["id"] for m in models["data"]] == [model_name]
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        want = client.generate("hello world", max_tokens=12, temperature=0.0)
    # unimplemented fields at the values that change nothing (as some clients send them) are accepted
    status, _, body = post(port, "/v1/completions", {"model": model_name, "prompt": "hello world", "max_tokens": 12,
                                                     "temperature": 0, "logprobs": None, "echo": False,
                                                     "presence_penalty": 0, "frequency_penalty": 0.0})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": want.usage.prompt_tokens, "completion_tokens": 12,
                             "total_tokens": want.usage.prompt_tokens + 12}

    events = sse(port, "/v1/completions", {"prompt": "hello world", "max_tokens": 12, "temperature": 0,
                                           "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == want.text
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 12

    chat = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 8}
    status, _, body = post(port, "/v1/chat/completions", chat)
    assert status == 200 and body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and body["usage"]["completion_tokens"] == 8
    events = sse(port, "/v1/chat/completions", {**chat, "stream": True})
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == message["content"]

    status, _, health = post(port, "/health", None, method="GET")
    assert status == 200 and health["serving"]


def test_errors_map_to_http_statuses(bench, model_name):
    bench.route(model_name, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0,
                             admission=AdmissionConfig(max_running=1, max_queued=0))
    port = gw.http_port
    cases = [({"prompt": "hi", "temperature": -1}, 400, "temperature -1"),
             ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens 0"),
             ({"prompt": [7] * 300}, 400, "context is 256"),
             ({"prompt": "hi", "model": "nope"}, 404, "model 'nope' is unknown"),
             ({"prompt": {"a": 1}}, 400, "prompt must be"),
             ({"prompt": ""}, 400, "prompt is empty: send some text or at least one token id"),
             ({"prompt": []}, 400, "prompt is empty: send some text"),
             ({"prompt": "hi", "n": 2}, 400, "n must be 1"),
             ({"prompt": "hi", "max_tokens": "3"}, 400, "max_tokens must be int"),
             # fields that would change the answer and are not implemented are refused, not ignored
             ({"prompt": "hi", "logprobs": 2}, 400, "logprobs is not supported (got 2); omit it"),
             ({"prompt": "hi", "logprobs": 0}, 400, "logprobs is not supported (got 0); omit it or set it to false"),
             ({"prompt": "hi", "echo": True}, 400, "echo is not supported"),
             ({"prompt": "hi", "best_of": True}, 400, "best_of is not supported (got true)"),
             ({"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty is not supported"),
             ({"prompt": "hi", "response_format": {"type": "json_object"}}, 400, 'set it to {"type": "text"}'),
             # every field is typed before the request is submitted: no truthy strings, no crashes
             ({"prompt": "hi", "stream": "yes"}, 400, 'stream must be bool, got "yes"'),
             ({"prompt": "hi", "ignore_eos": "no"}, 400, 'ignore_eos must be bool, got "no"'),
             ({"prompt": "hi", "stream": True, "stream_options": 5}, 400, "stream_options must be dict, got 5"),
             ({"prompt": "hi", "stream_options": {"include_usage": 1}}, 400, "include_usage must be bool"),
             ({"prompt": "hi", "stop_token_ids": ["a"]}, 400, 'stop_token_ids must be a list of token ids, got ["a"]'),
             ({"prompt": "hi", "stop": ["a", 3]}, 400, "stop must be a list of strings"),
             ({"messages": [{"role": "user", "content": "hi"}]}, 400, "(messages are for /v1/chat/completions)")]
    for body, status, needle in cases:
        got, _, error = post(port, "/v1/completions", body)
        assert got == status and needle in error["error"]["message"], (body, got, error)
    for body, needle in [({"prompt": "hi"}, "(prompt is for /v1/completions)"),
                         ({"messages": [{"content": "hi"}]}, "messages must be a non-empty list of")]:
        got, _, error = post(port, "/v1/chat/completions", body)
        assert got == 400 and needle in error["error"]["message"], (body, got, error)
    got, _, error = post(port, "/v1/completions", b"{not json")
    assert got == 400 and "not JSON" in error["error"]["message"]
    got, _, _ = post(port, "/v1/nothing", {})
    assert got == 404

    threading.Thread(target=lambda: post(port, "/v1/completions", {"prompt": "x", "max_tokens": 20})).start()
    bench.wait_until(lambda: gw.gateway.admission.num_running == 1, what="a running request")
    got, headers, error = post(port, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert got == 429 and int(headers["Retry-After"]) >= 1 and "max_running 1" in error["error"]["message"]


def test_no_route_is_503(bench, model_name):
    bench.add_replica(model_name, 0)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0, route_wait_s=0.1)
    status, _, error = post(gw.http_port, "/v1/completions", {"prompt": "hi"})
    assert status == 503 and "stage [1]" in error["error"]["message"]
    status, _, _ = post(gw.http_port, "/health", None, method="GET")
    assert status == 503


def test_sse_client_disconnect_cancels_downstream(bench, model_name):
    (fake,), _ = bench.route(model_name, token_delay_s=0.02)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0)
    body = json.dumps({"prompt": "hi", "max_tokens": 200, "stream": True, "request_id": "http-gone"}).encode()
    with socket.create_connection(("127.0.0.1", gw.http_port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data: ") < 3:
            received += s.recv(4096)
    bench.wait_until(lambda: "http-gone" in fake.cancelled, what="stage 0 stream closed after the HTTP client left")
    with Client(f"127.0.0.1:{gw.port}", timeout=10) as client:
        bench.wait_until(lambda: client.get_request("http-gone").state == "cancelled", what="record CANCELLED")


def test_a_bug_answers_500_and_the_server_keeps_serving(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0)

    async def broken_list_models():  # a fake bug: what is under test is the front door's answer to one
        raise RuntimeError("fake bug for the test")

    gw.gateway.list_models = broken_list_models
    status, _, error = post(gw.http_port, "/v1/models", None, method="GET")
    assert status == 500 and error["error"]["message"].startswith("internal error (RuntimeError: fake bug")
    status, _, body = post(gw.http_port, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_idle_and_trickling_connections_are_closed(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), http_port=0, http_idle_timeout_s=0.3)
    for opening in (b"", b"POST /v1/completions HTTP/1.1\r\nContent-Type: app"):  # idle; a head never finished
        with socket.create_connection(("127.0.0.1", gw.http_port), timeout=5) as s:
            s.sendall(opening)
            start = time.monotonic()
            assert s.recv(1024) == b"", "the server closes the connection"
            assert time.monotonic() - start < 3
    status, _, body = post(gw.http_port, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def raw_request(port: int, data: bytes) -> tuple[int, dict]:
    """Send bytes as they are (asking to close); the status and JSON body of the answer, after
    checking that the server said it closes and did."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        response = http.client.HTTPResponse(s)
        response.begin()
        body = json.loads(response.read())
        assert response.getheader("Connection") == "close" and s.recv(1) == b"", "Connection: close is honoured"
        return response.status, body


def test_chunked_bodies_and_bad_lengths(bench, model_name):
    bench.route(model_name)
    port = bench.start_gateway(model_names=(model_name,), http_port=0).http_port
    body = json.dumps({"prompt": "hi", "max_tokens": 3}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])) + b"0\r\n\r\n"
    status, answer = raw_request(port, chunked)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3, answer
    status, answer = raw_request(port, head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert status == 400 and "malformed chunk size" in answer["error"]["message"]
    status, answer = raw_request(port, head + b"Content-Length: ten\r\n\r\n")
    assert status == 400 and "Content-Length 'ten' is not a number" in answer["error"]["message"]
