"""The asyncio client: AsyncClient mirrors Client with coroutines and async iterators.

    async with AsyncClient("localhost:50051") as client:
        result = await client.generate("Hello", max_tokens=32)
        async for delta in client.stream("Hello", max_tokens=32):
            print(delta.text, end="")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from shardline.v1 import gateway_pb2, gateway_pb2_grpc

from .errors import Internal, ShardlineError, error_from_rpc
from .retry import Deadline, RetryPolicy, retry_delay
from .types import (Delta, GenerateResult, ModelInfo, RequestInfo, StreamState, build_request,
                    models_from_wire, request_info_from_wire, result_from_wire)


class AsyncClient:
    def __init__(self, target: str, *, timeout: float | None = None, retry: RetryPolicy = RetryPolicy(),
                 channel: grpc.aio.Channel | None = None) -> None:
        self.target, self.timeout, self.retry = target, timeout, retry
        self._channel = channel or grpc.aio.insecure_channel(target)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.timeout if timeout is None else timeout)

    async def generate(self, prompt: str | Sequence[int] | Sequence[dict], *, timeout: float | None = None,
                       **params) -> GenerateResult:
        request = build_request(prompt, **params)
        deadline, start, num_failed = self._deadline(timeout), time.monotonic(), 0
        while True:
            try:
                response = await self._stub.Generate(request, timeout=deadline.remaining())
                return result_from_wire(response, time.monotonic() - start)
            except grpc.aio.AioRpcError as e:
                error, num_failed = error_from_rpc(e, request.request_id), num_failed + 1
                delay = retry_delay(error, num_failed, False, self.retry, deadline)
                if delay is None:
                    raise error from None
                await asyncio.sleep(delay)

    def stream(self, prompt: str | Sequence[int] | Sequence[dict], *, timeout: float | None = None,
               **params) -> "AsyncStream":
        return AsyncStream(self, build_request(prompt, **params), self._deadline(timeout))

    async def cancel(self, request_id: str, *, timeout: float | None = None) -> bool:
        try:
            response = await self._stub.Cancel(gateway_pb2.CancelRequest(request_id=request_id),
                                               timeout=self._deadline(timeout).remaining())
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e, request_id) from None
        return response.cancelled

    async def get_request(self, request_id: str, *, timeout: float | None = None) -> RequestInfo:
        try:
            status = await self._stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id),
                                                 timeout=self._deadline(timeout).remaining())
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e, request_id) from None
        return request_info_from_wire(status)

    async def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        try:
            response = await self._stub.ListModels(gateway_pb2.ListModelsRequest(),
                                                   timeout=self._deadline(timeout).remaining())
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from None
        return models_from_wire(response)


class AsyncStream(StreamState):
    """An async iterator of Delta; attributes as on the sync Stream. cancel() or leaving an
    `async with` block early cancels the request."""

    def __init__(self, client: AsyncClient, request: gateway_pb2.GenerateRequest, deadline: Deadline) -> None:
        super().__init__(request)
        self._client, self._deadline = client, deadline
        self._call = None
        self._is_cancelled = False
        self._iterator: AsyncIterator[Delta] | None = None

    def __aiter__(self) -> AsyncIterator[Delta]:
        if self._iterator is None:
            self._iterator = self._run()
        return self._iterator

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        if not self.finish_reason:
            self.cancel()
        if self._iterator is not None:
            await self._iterator.aclose()

    def cancel(self) -> None:
        self._is_cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def result(self) -> GenerateResult:
        async for _ in self:
            pass
        return self._result()

    async def _run(self) -> AsyncIterator[Delta]:
        num_failed, has_token = 0, False
        while not self._is_cancelled:
            self._call = self._client._stub.GenerateStream(self._request, timeout=self._deadline.remaining())
            try:
                async for message in self._call:
                    delta = self._apply(message)
                    if delta is None:
                        return
                    has_token = has_token or bool(delta.token_ids)
                    yield delta
                raise Internal("the gateway ended the stream without a complete or error message", self.request_id)
            except asyncio.CancelledError:
                if not self._is_cancelled or asyncio.current_task().cancelling():
                    raise  # our task is being cancelled, not just the call
                break
            except grpc.aio.AioRpcError as e:
                if self._is_cancelled:
                    break
                error = error_from_rpc(e, self.request_id)
            except ShardlineError as e:
                error = e
            finally:
                if self._call is not None and not self._call.done():
                    self._call.cancel()  # the caller stopped iterating: cancel downstream
            num_failed += 1
            delay = retry_delay(error, num_failed, has_token, self._client.retry, self._deadline)
            if delay is None:
                raise error
            await asyncio.sleep(delay)
        self.finish_reason = "cancelled"
