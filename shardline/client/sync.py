"""The blocking client.

    with Client("localhost:50051") as client:
        result = client.generate("Hello", max_tokens=32, temperature=0.0)
        print(result.text, result.token_ids, result.finish_reason, result.time_to_first_token_s)
        for delta in client.stream("Hello", max_tokens=32):
            print(delta.text, end="", flush=True)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import grpc

from shardline.v1 import gateway_pb2, gateway_pb2_grpc

from .errors import Internal, ShardlineError, error_from_rpc
from .retry import Deadline, RetryPolicy, retry_delay
from .types import (Delta, GenerateResult, ModelInfo, RequestInfo, StreamState, build_request,
                    models_from_wire, request_info_from_wire, result_from_wire)


class Client:
    def __init__(self, target: str, *, timeout: float | None = None, retry: RetryPolicy = RetryPolicy(),
                 channel: grpc.Channel | None = None) -> None:
        """target: "host:port" of a gateway. timeout: default deadline (seconds) for every call,
        retries included; None = no deadline. retry: what to do on UNAVAILABLE before a token."""
        self.target, self.timeout, self.retry = target, timeout, retry
        self._channel = channel or grpc.insecure_channel(target)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.timeout if timeout is None else timeout)

    def generate(self, prompt: str | Sequence[int] | Sequence[dict], *, timeout: float | None = None,
                 **params) -> GenerateResult:
        """The whole completion. params: model, max_tokens, temperature, top_k, top_p, seed, stop,
        stop_token_ids, ignore_eos, request_id."""
        request = build_request(prompt, **params)
        deadline, start, num_failed = self._deadline(timeout), time.monotonic(), 0
        while True:
            try:
                response = self._stub.Generate(request, timeout=deadline.remaining())
                return result_from_wire(response, time.monotonic() - start)
            except grpc.RpcError as e:
                error, num_failed = error_from_rpc(e, request.request_id), num_failed + 1
                delay = retry_delay(error, num_failed, False, self.retry, deadline)
                if delay is None:
                    raise error from None
                time.sleep(delay)

    def stream(self, prompt: str | Sequence[int] | Sequence[dict], *, timeout: float | None = None,
               **params) -> "Stream":
        """Deltas as they come: iterate the returned Stream. Same params as generate()."""
        return Stream(self, build_request(prompt, **params), self._deadline(timeout))

    def cancel(self, request_id: str, *, timeout: float | None = None) -> bool:
        """True if the request was queued or running and is now being cancelled."""
        try:
            return self._stub.Cancel(gateway_pb2.CancelRequest(request_id=request_id),
                                     timeout=self._deadline(timeout).remaining()).cancelled
        except grpc.RpcError as e:
            raise error_from_rpc(e, request_id) from None

    def get_request(self, request_id: str, *, timeout: float | None = None) -> RequestInfo:
        try:
            status = self._stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id),
                                           timeout=self._deadline(timeout).remaining())
        except grpc.RpcError as e:
            raise error_from_rpc(e, request_id) from None
        return request_info_from_wire(status)

    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        try:
            return models_from_wire(self._stub.ListModels(gateway_pb2.ListModelsRequest(),
                                                          timeout=self._deadline(timeout).remaining()))
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None


class Stream(StreamState):
    """An iterator of Delta. After it is exhausted: finish_reason, matched_stop, usage, timings,
    text and token_ids (everything received). cancel() (any thread) ends it with finish_reason
    "cancelled"; leaving a `with` block early cancels too."""

    def __init__(self, client: Client, request: gateway_pb2.GenerateRequest, deadline: Deadline) -> None:
        super().__init__(request)
        self._client, self._deadline = client, deadline
        self._call = None
        self._is_cancelled = False
        self._iterator: Iterator[Delta] | None = None

    def __iter__(self) -> Iterator[Delta]:
        if self._iterator is None:
            self._iterator = self._run()
        return self._iterator

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        if not self.finish_reason:
            self.cancel()

    def cancel(self) -> None:
        self._is_cancelled = True
        if self._call is not None:
            self._call.cancel()

    def result(self) -> GenerateResult:
        """Consume what is left and return it all as one result."""
        for _ in self:
            pass
        return self._result()

    def _run(self) -> Iterator[Delta]:
        num_failed, has_token = 0, False
        while not self._is_cancelled:
            self._call = self._client._stub.GenerateStream(self._request, timeout=self._deadline.remaining())
            try:
                for message in self._call:
                    delta = self._apply(message)
                    if delta is None:
                        return
                    has_token = has_token or bool(delta.token_ids)
                    yield delta
                raise Internal("the gateway ended the stream without a complete or error message", self.request_id)
            except grpc.RpcError as e:
                if self._is_cancelled:
                    break
                error = error_from_rpc(e, self.request_id)
            except ShardlineError as e:
                error = e
            finally:
                if not self._call.done():
                    self._call.cancel()  # the caller stopped iterating: cancel downstream
            num_failed += 1
            delay = retry_delay(error, num_failed, has_token, self._client.retry, self._deadline)
            if delay is None:
                raise error
            time.sleep(delay)
        self.finish_reason = "cancelled"
