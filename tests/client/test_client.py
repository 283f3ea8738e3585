"""The client SDK against a real gRPC server that misbehaves on purpose (FakeGateway).

What matters: UNAVAILABLE is retried before the first token only, a bounded number of times,
with backoff, inside the caller's deadline; other codes become typed errors at once;
RESOURCE_EXHAUSTED carries the server's retry hint.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent import futures

import grpc
import pytest

from shardline.client import (AsyncClient, Client, DeadlineExceeded, InvalidArgument, OutOfRange, ResourceExhausted,
                              RetryPolicy, ShardlineError, Unavailable)
from shardline.client.retry import Deadline, retry_delay
from shardline.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)


class FakeGateway(gateway_pb2_grpc.GatewayServicer):
    """Fails the first `num_failures` calls with `code`, then answers. Streams can fail mid-way."""

    def __init__(self) -> None:
        self.num_failures, self.code = 0, grpc.StatusCode.UNAVAILABLE
        self.fail_stream_after = None  # chunks sent before a mid-stream UNAVAILABLE
        self.stream_error_after = None  # chunks sent before a StreamError message
        self.calls: list[tuple[str, float, str]] = []  # (method, time, request_id)
        self.delay_s = 0.0

    def _maybe_fail(self, method, request, context):
        self.calls.append((method, time.monotonic(), request.request_id))
        if self.delay_s:
            time.sleep(self.delay_s)
        if len([c for c in self.calls if c[0] == method]) <= self.num_failures:
            if self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                context.set_trailing_metadata((("retry-after-ms", "1500"),))
            context.abort(self.code, f"fake {self.code.name}")

    def Generate(self, request, context):
        self._maybe_fail("Generate", request, context)
        return gateway_pb2.GenerateResponse(request_id=request.request_id, text="ok", token_ids=[1, 2],
                                            finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                            timings=common_pb2.Timings(time_to_first_token_seconds=0.1,
                                                                       total_seconds=0.2))

    def GenerateStream(self, request, context):
        self._maybe_fail("GenerateStream", request, context)
        for i in range(4):
            if self.fail_stream_after == i:
                context.abort(grpc.StatusCode.UNAVAILABLE, "fake: went away mid-stream")
            if self.stream_error_after == i:
                yield gateway_pb2.GenerateStreamResponse(request_id=request.request_id, error=gateway_pb2.StreamError(
                    code="UNAVAILABLE", message="fake: route lost"))
                return
            yield gateway_pb2.GenerateStreamResponse(request_id=request.request_id, chunk=gateway_pb2.StreamChunk(
                text=f"t{i} ", token_ids=[i]))
        yield gateway_pb2.GenerateStreamResponse(request_id=request.request_id, complete=gateway_pb2.StreamComplete(
            finish_reason=common_pb2.FINISH_REASON_STOP, matched_stop="."))


@pytest.fixture
def fake():
    servicer = FakeGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.address = f"127.0.0.1:{port}"
    yield servicer
    server.stop(0)


def test_unavailable_is_retried_with_backoff_and_the_same_request_id(fake):
    fake.num_failures = 2
    with Client(fake.address, retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.05, max_backoff_s=1.0,
                                                jitter=0.0)) as client:
        result = client.generate("hi", request_id="same-id")
    assert result.text == "ok" and result.token_ids == [1, 2] and result.finish_reason == "length"
    assert result.time_to_first_token_s == 0.1 and result.total_s == 0.2 and result.client_total_s > 0
    times = [t for _, t, _ in fake.calls]
    assert len(times) == 3 and {rid for _, _, rid in fake.calls} == {"same-id"}
    assert times[1] - times[0] >= 0.045 and times[2] - times[1] >= 0.095, "backoff must grow between attempts"


def test_retries_are_bounded(fake):
    fake.num_failures = 100
    with Client(fake.address, retry=FAST) as client, pytest.raises(Unavailable) as e:
        client.generate("hi")
    assert len(fake.calls) == 4, "max_attempts counts every attempt, the first included"
    assert isinstance(e.value, ShardlineError) and "fake UNAVAILABLE" in e.value.message


@pytest.mark.parametrize("code,error", [(grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
                                        (grpc.StatusCode.OUT_OF_RANGE, OutOfRange)])
def test_other_codes_are_typed_and_never_retried(fake, code, error):
    fake.num_failures, fake.code = 1, code
    with Client(fake.address, retry=FAST) as client, pytest.raises(error):
        client.generate("hi")
    assert len(fake.calls) == 1


def test_resource_exhausted_carries_the_retry_hint(fake):
    fake.num_failures, fake.code = 1, grpc.StatusCode.RESOURCE_EXHAUSTED
    with Client(fake.address, retry=FAST) as client, pytest.raises(ResourceExhausted) as e:
        client.generate("hi")
    assert e.value.retry_after_s == 1.5 and len(fake.calls) == 1


def test_deadline_covers_all_attempts(fake):
    fake.num_failures, fake.delay_s = 100, 0.1
    start = time.monotonic()
    with Client(fake.address, retry=RetryPolicy(max_attempts=50, initial_backoff_s=0.05, max_backoff_s=0.05)) as c:
        with pytest.raises((DeadlineExceeded, Unavailable)):
            c.generate("hi", timeout=0.5)
    assert time.monotonic() - start < 1.0, "retries must stop at the caller's deadline"


def test_stream_retries_before_the_first_token(fake):
    fake.num_failures = 2
    with Client(fake.address, retry=FAST) as client:
        stream = client.stream("hi")
        deltas = list(stream)
    assert [d.token_ids for d in deltas] == [[0], [1], [2], [3]]
    assert stream.text == "t0 t1 t2 t3 " and stream.finish_reason == "stop" and stream.matched_stop == "."
    assert len(fake.calls) == 3


@pytest.mark.parametrize("how", ["status", "stream_error"])
def test_stream_is_not_retried_after_a_token(fake, how):
    if how == "status":
        fake.fail_stream_after = 2
    else:
        fake.stream_error_after = 2
    got = []
    with Client(fake.address, retry=FAST) as client, pytest.raises(Unavailable):
        for delta in client.stream("hi"):
            got.extend(delta.token_ids)
    assert got == [0, 1] and len(fake.calls) == 1, "a retry after a token would repeat it"


def test_stream_error_before_a_token_is_retried(fake):
    fake.stream_error_after = 0
    with Client(fake.address, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as client:
        with pytest.raises(Unavailable, match="route lost"):
            list(client.stream("hi"))
    assert len(fake.calls) == 2


def test_async_client_mirrors_the_sync_one(fake):
    fake.num_failures = 1

    async def main():
        async with AsyncClient(fake.address, retry=FAST) as client:
            result = await client.generate("hi")
            fake.calls.clear()
            fake.num_failures = 1
            stream = client.stream("hi")
            deltas = [d async for d in stream]
            fake.calls.clear()
            fake.fail_stream_after, fake.num_failures = 1, 0
            with pytest.raises(Unavailable):
                async for _ in client.stream("hi"):
                    pass
            fake.code, fake.num_failures = grpc.StatusCode.INVALID_ARGUMENT, 100
            with pytest.raises(InvalidArgument):
                await client.generate("hi")
            return result, deltas, stream

    result, deltas, stream = asyncio.run(main())
    assert result.text == "ok" and len(deltas) == 4 and stream.finish_reason == "stop"


def test_retry_delay_rules():
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=1.0, max_backoff_s=3.0, jitter=0.0)
    no_deadline = Deadline(None)
    assert retry_delay(Unavailable("x"), 1, False, policy, no_deadline) == 1.0
    assert retry_delay(Unavailable("x"), 2, False, policy, no_deadline) == 2.0
    assert retry_delay(Unavailable("x"), 3, False, policy, no_deadline) is None, "bounded by max_attempts"
    assert retry_delay(Unavailable("x"), 1, True, policy, no_deadline) is None, "never after a token"
    assert retry_delay(InvalidArgument("x"), 1, False, policy, no_deadline) is None
    assert retry_delay(Unavailable("x"), 1, False, policy, Deadline(0.5)) is None, "no sleep past the deadline"
    assert RetryPolicy(initial_backoff_s=1, max_backoff_s=2, multiplier=10, jitter=0).backoff_s(3) == 2


@pytest.mark.parametrize("kwargs,needle", [
    ({"seed": -5}, "seed must be an int in 0..2**63-1; got -5"),
    ({"max_tokens": 2**40}, "max_tokens must be a positive int; got 1099511627776"),
    ({"temperature": "hot"}, "temperature must be a number; got 'hot'"),
    ({"stop": [3]}, "stop must be a list of str"),
    ({"prompt": [1, 2**40]}, "prompt token ids must be a list of token ids (int32)"),
])
def test_a_value_the_wire_cannot_carry_names_its_parameter(fake, kwargs, needle):
    prompt = kwargs.pop("prompt", "hi")
    with Client(fake.address, retry=FAST) as client:
        with pytest.raises(ValueError) as e:
            client.generate(prompt, **kwargs)
        assert needle in str(e.value)
        with pytest.raises(ValueError):
            list(client.stream(prompt, **kwargs))
        assert fake.calls == [], "nothing is sent"
        assert client.generate("hi").text, "the client keeps working"


def test_shardline_request_prints_the_completion(fake, capsys):
    from shardline.cli import main

    assert main(["request", "--gateway", fake.address, "Hello"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main(["request", "--gateway", fake.address, "--json", "Hello"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["text"], result["token_ids"], result["finish_reason"]) == ("ok", [1, 2], "length")


def test_shardline_request_exits_1_naming_the_gateways_error(fake, capsys):
    from shardline.cli import main

    fake.num_failures, fake.code = 1, grpc.StatusCode.INVALID_ARGUMENT
    assert main(["request", "--gateway", fake.address, "Hello"]) == 1
    assert capsys.readouterr().err == "shardline request: INVALID_ARGUMENT: fake INVALID_ARGUMENT\n"
