"""The gateway's side of the tokenizer service: encode, chat template, info, streaming detokenize.

gRPC failures become typed gateway errors here, so the rest of the gateway never sees a status code
from the tokenizer.
"""

from __future__ import annotations

import asyncio

import grpc

from shardline.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

from .errors import GatewayError, Internal, InvalidArgument, Unavailable


def _translate(e: grpc.aio.AioRpcError, address: str) -> GatewayError:
    if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(e.details() or "the tokenizer rejected the request")
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"tokenizer service at {address} is unavailable ({e.code().name}: {e.details()}); "
                           "retry later")
    return Internal(f"tokenizer service at {address} failed: {e.code().name}: {e.details()}")


class TokenizerClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address, self.timeout_s = address, timeout_s
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = tokenizer_pb2_grpc.TokenizerStub(self._channel)
        self._info: tokenizer_pb2.TokenizerInfo | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def info(self) -> tokenizer_pb2.TokenizerInfo:
        if self._info is None:
            try:
                self._info = await self._stub.GetInfo(tokenizer_pb2.GetInfoRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as e:
                raise _translate(e, self.address) from e
        return self._info

    async def encode(self, text: str) -> list[int]:
        try:
            r = await self._stub.Encode(tokenizer_pb2.EncodeRequest(text=text, add_special_tokens=True),
                                        timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise _translate(e, self.address) from e
        return list(r.token_ids)

    async def apply_chat_template(self, messages: list[dict]) -> list[int]:
        request = tokenizer_pb2.ApplyChatTemplateRequest(
            messages=[common_pb2.ChatMessage(role=m.get("role", ""), content=m.get("content", ""))
                      for m in messages],
            add_generation_prompt=True)
        try:
            r = await self._stub.ApplyChatTemplate(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            raise _translate(e, self.address) from e
        return list(r.token_ids)

    def detokenizer(self, stop: list[str], prefix_token_ids: list[int]) -> "Detokenizer":
        return Detokenizer(self, stop, prefix_token_ids)


class Detokenizer:
    """One sequence's DetokenizeStream: push ids, get text deltas; finish() flushes held-back text.

    The stream opens lazily with the first ids, so a request that never produced a token costs
    the tokenizer nothing.
    """

    def __init__(self, client: TokenizerClient, stop: list[str], prefix_token_ids: list[int]) -> None:
        self._client, self._stop, self._prefix = client, list(stop), list(prefix_token_ids)
        self._call = None
        self.is_finished = False  # the tokenizer ended the stream (stop match, or flushed)

    async def push(self, token_ids: list[int]) -> tokenizer_pb2.DetokenizeResponse:
        request = tokenizer_pb2.DetokenizeRequest(token_ids=token_ids)
        if self._call is None:
            self._call = self._client._stub.DetokenizeStream()
            request.stop.extend(self._stop)
            request.skip_special_tokens = True
            request.prefix_token_ids.extend(self._prefix)

        async def exchange():
            await self._call.write(request)
            return await self._read()

        return await self._answer(exchange())

    async def finish(self) -> tokenizer_pb2.DetokenizeResponse | None:
        """Half-close and return the flush response (None if nothing was ever pushed)."""
        if self._call is None or self.is_finished:
            return None

        async def flush():
            await self._call.done_writing()
            return await self._read()

        return await self._answer(flush())

    async def _answer(self, exchange) -> tokenizer_pb2.DetokenizeResponse:
        """One message's answer within the client's timeout: the stream lives as long as the
        sequence, so it has no deadline of its own, but a tokenizer that stops answering must
        not hold the request forever."""
        try:
            return await asyncio.wait_for(exchange, self._client.timeout_s)
        except asyncio.TimeoutError:
            self.close()
            raise Unavailable(f"tokenizer service at {self._client.address} did not answer a detokenize within "
                              f"{self._client.timeout_s:.0f}s; retry later") from None
        except grpc.aio.AioRpcError as e:
            raise _translate(e, self._client.address) from e

    async def _read(self) -> tokenizer_pb2.DetokenizeResponse:
        response = await self._call.read()
        if response is grpc.aio.EOF:
            raise Internal(f"tokenizer service at {self._client.address} ended the detokenize stream early")
        self.is_finished = response.finished
        return response

    def close(self) -> None:
        if self._call is not None and not self._call.done():
            self._call.cancel()
