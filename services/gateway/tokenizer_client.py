"""The gateway's side of the tokenizer service: encode, chat template, info, streaming detokenize.

Every request's detokenization shares one DetokenizeMany stream to its tokenizer (DetokenizeMux):
a stream of its own cost each request two gRPC messages and their asyncio work a token, about as
much gateway CPU as everything else it does for a token.

gRPC failures become typed gateway errors here, so the rest of the gateway never sees a status code
from the tokenizer.
"""

from __future__ import annotations

import asyncio

import grpc

from shardline.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

from .errors import GatewayError, Internal, InvalidArgument, Unavailable
from .gathering import Gatherer


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
        self._mux = DetokenizeMux(self)

    async def close(self) -> None:
        self._mux.close()
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
        return Detokenizer(self._mux, stop, prefix_token_ids)


class DetokenizeMux:
    """The gateway's one DetokenizeMany stream to a tokenizer, shared by every request: the items
    that requests hand in while a message is out go together in the next one (one message in
    flight, answered before the next is sent, so answers match items by position).

    A message unanswered within the client's timeout, or a stream that breaks, fails the items it
    carried (UNAVAILABLE) and ends the stream; the next items open a new one. The sequences of a
    broken stream lost their state in the tokenizer, so `epoch` counts streams and a Detokenizer
    from an older one fails its next item instead of continuing without its stop strings."""

    def __init__(self, client: "TokenizerClient") -> None:
        self._client = client
        self._call = None
        self.epoch = 0
        self._last_sequence = 0
        # (item, the epoch its sequence began in); see gathering.py
        self._items: Gatherer[tuple[tokenizer_pb2.DetokenizeItem, int]] = Gatherer(
            self._send_batch, f"detokenize-{client.address}")
        self.num_messages = self.num_items = 0  # sent, over the mux's life

    def new_sequence(self) -> tuple[int, int]:
        """(epoch, sequence number) for a sequence that starts now. Numbers reach the tokenizer in
        the order they are taken (Detokenizer.push queues its first item at once), as it expects."""
        self._last_sequence += 1
        return self.epoch, self._last_sequence

    def exchange(self, item: tokenizer_pb2.DetokenizeItem, epoch: int) -> asyncio.Future:
        """The item's answer (a DetokenizedItem), once the message carrying it is answered; `epoch`:
        the one its sequence began in."""
        return self._items.submit((item, epoch))

    def forget(self, sequence: int, epoch: int) -> None:
        """Tell the tokenizer to drop a sequence whose request went away (no answer)."""
        self._items.put((tokenizer_pb2.DetokenizeItem(sequence=sequence, cancel=True), epoch))

    def close(self) -> None:
        self._items.cancel()
        self._end_stream()

    def stale_error(self) -> Unavailable:
        return Unavailable(f"the detokenize stream to the tokenizer service at {self._client.address} broke "
                           "and this request's text state went with it; retry")

    async def _send_batch(self, batch) -> None:
        """One DetokenizeMany message for the items of the current stream; an item handed in as
        the stream broke fails, since the new stream does not know its sequence."""
        live = []
        for (item, epoch), answer in batch:
            if epoch == self.epoch:
                live.append((item, answer))
            elif answer is not None and not answer.done():
                answer.set_exception(self.stale_error())
        if not live:
            return
        self.num_messages, self.num_items = self.num_messages + 1, self.num_items + len(live)
        try:
            response = await self._round_trip([item for item, _ in live])
        except GatewayError:
            self._end_stream()
            raise  # fails the items (gathering.Gatherer)
        answers = iter(response.items)
        for item, answer in live:
            if item.cancel:
                continue
            got = next(answers)
            if answer is not None and not answer.done():  # a request that timed out is done
                answer.set_result(got)

    async def _round_trip(self, items: list) -> tokenizer_pb2.DetokenizeManyResponse:
        address, timeout_s = self._client.address, self._client.timeout_s
        if self._call is None:
            self._call = self._client._stub.DetokenizeMany()
        try:
            async with asyncio.timeout(timeout_s):
                await self._call.write(tokenizer_pb2.DetokenizeManyRequest(items=items))
                response = await self._call.read()
        except TimeoutError:
            raise Unavailable(f"tokenizer service at {address} did not answer a detokenize within "
                              f"{timeout_s:.0f}s; retry later") from None
        except grpc.aio.AioRpcError as e:
            raise _translate(e, address) from e
        except Exception as e:  # noqa: BLE001 - e.g. a write on a call that just ended: fail the items, not hang them
            raise Unavailable(f"the detokenize stream to the tokenizer service at {address} failed ({e!r}); "
                              "retry later") from e
        if response is grpc.aio.EOF:
            raise Unavailable(f"tokenizer service at {address} ended the detokenize stream; retry later")
        if len(response.items) != sum(not item.cancel for item in items):
            raise Internal(f"tokenizer service at {address} answered {len(response.items)} of "
                           f"{sum(not item.cancel for item in items)} detokenize items")
        return response

    def _end_stream(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            self.epoch += 1
            if not call.done():
                call.cancel()


class Detokenizer:
    """One sequence's detokenization: push ids, get text deltas; finish() flushes held-back text.

    Its items travel on the gateway's shared DetokenizeMany stream (DetokenizeMux). The sequence
    starts lazily with the first ids, so a request that never produced a token costs the
    tokenizer nothing.
    """

    def __init__(self, mux: DetokenizeMux, stop: list[str], prefix_token_ids: list[int]) -> None:
        self._mux, self._stop, self._prefix = mux, list(stop), list(prefix_token_ids)
        self._sequence: tuple[int, int] | None = None  # (stream epoch, number) once ids went out
        self.is_finished = False  # the sequence ended (stop match, or flushed)

    async def push(self, token_ids: list[int]) -> tokenizer_pb2.DetokenizeResponse:
        request = tokenizer_pb2.DetokenizeRequest(token_ids=token_ids)
        if self._sequence is None:
            self._sequence = self._mux.new_sequence()
            request.stop.extend(self._stop)
            request.skip_special_tokens = True
            request.prefix_token_ids.extend(self._prefix)
        return await self._answer(tokenizer_pb2.DetokenizeItem(request=request))

    async def finish(self) -> tokenizer_pb2.DetokenizeResponse | None:
        """The flush response (None if nothing was ever pushed)."""
        if self._sequence is None or self.is_finished:
            return None
        return await self._answer(tokenizer_pb2.DetokenizeItem(close=True))

    async def _answer(self, item: tokenizer_pb2.DetokenizeItem) -> tokenizer_pb2.DetokenizeResponse:
        epoch, item.sequence = self._sequence
        if epoch != self._mux.epoch:
            self.is_finished = True
            raise self._mux.stale_error()
        answer = await self._mux.exchange(item, epoch)
        if answer.error:
            self.is_finished = True
            raise InvalidArgument(answer.error)
        self.is_finished = answer.response.finished
        return answer.response

    def close(self) -> None:
        """The request ended: the tokenizer may drop the sequence."""
        if self._sequence is not None and not self.is_finished and self._sequence[0] == self._mux.epoch:
            self._mux.forget(self._sequence[1], self._sequence[0])
        self.is_finished = True
