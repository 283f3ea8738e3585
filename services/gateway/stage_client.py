"""Channels to stage-0 replicas: one GenerateMany stream each, which every request routed there
shares to admit its sequence and receive its tokens, and a liveness probe.

One stream a replica, not a Generate stream a request: stage 0 then sends a decode step's tokens
for all of a gateway's sequences in one message from one thread, where a stream a request woke a
server thread a token, each taking the GIL from the loop that schedules the next step
(docs/benchmarks.md, session s). Before its first stream to a replica the mux asks whether the
replica has GenerateMany at all (an empty stream, closed at once: UNIMPLEMENTED from a replica of
an older version, since a rolling upgrade replaces gateways and stage workers in no set order);
where it has not, each sequence goes on a Generate stream of its own, as before.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from shardline.sampling import SamplingParams
from shardline.v1 import common_pb2, stage_pb2, stage_pb2_grpc

from .gathering import Gatherer, settle

log = logging.getLogger("shardline.gateway")
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def sampling_to_wire(p: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                                     max_tokens=p.max_tokens, stop_token_ids=list(p.stop_token_ids),
                                     ignore_eos=p.ignore_eos)


class AdmittedSequence:
    """One sequence on a GenerateMany stream (or, where the replica has none, relayed from a
    Generate stream of its own), as a Generate call looks: iterate it for its
    TokenEvents (it ends after the one with a finish_reason; a refusal or a broken stream raises
    the AioRpcError that Generate would have), cancel() it to cancel the sequence along its route
    (the iteration then raises CancelledError)."""

    def __init__(self, mux: "GenerateMux", sequence: int, admit: stage_pb2.AdmitRequest) -> None:
        self._mux, self.sequence, self.admit = mux, sequence, admit
        self._events: asyncio.Queue = asyncio.Queue()
        self._done = False
        self._relay: asyncio.Task | None = None  # its Generate stream, where the replica has no GenerateMany

    def done(self) -> bool:
        return self._done

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            if self._relay is not None:
                self._relay.cancel()  # cancels its Generate call
            else:
                self._mux.cancel(self.sequence)
            self._events.put_nowait(asyncio.CancelledError())

    def __aiter__(self) -> "AdmittedSequence":
        return self

    async def __anext__(self) -> stage_pb2.TokenEvent:
        got = await self._events.get()
        if got is None:
            raise StopAsyncIteration
        if isinstance(got, BaseException):
            self._done = True
            raise got
        if got.finish_reason:
            self._done = True
            self._events.put_nowait(None)
        return got

    def _deliver(self, got) -> None:
        """From the stream's reader: an event, or the error that ends the sequence."""
        self._events.put_nowait(got)


class GenerateMux:
    """The gateway's GenerateMany stream to one stage-0 replica. Admissions and cancels that
    requests hand in while a message is being written go together in the next; a reader task
    hands each reply's items to their sequences. A stream that breaks fails every sequence on it
    (as each one's Generate call would have failed), and the next admission opens a new one."""

    def __init__(self, stub: stage_pb2_grpc.StageWorkerStub, address: str) -> None:
        self._stub, self.address = stub, address
        self._call = None
        self._reader: asyncio.Task | None = None
        self._open: dict[int, AdmittedSequence] = {}  # on the current stream, not yet ended
        self._last_sequence = 0
        self._items: Gatherer[stage_pb2.AdmitItem] = Gatherer(self._send, f"generate-{address}")
        self.num_messages = self.num_items = 0  # written, over the mux's life
        self.per_sequence = False  # the replica has no GenerateMany: a Generate stream a sequence
        self._probed = False  # per_sequence is known (asked again after a stream that carried nothing)
        self._received = False  # the current stream has carried a message

    def generate(self, admit: stage_pb2.AdmitRequest) -> AdmittedSequence:
        self._last_sequence += 1
        sequence = AdmittedSequence(self, self._last_sequence, admit)
        if self.per_sequence:
            self._start_relay(sequence)
            return sequence
        self._open[sequence.sequence] = sequence
        self._items.put(stage_pb2.AdmitItem(sequence=sequence.sequence, admit=admit))
        return sequence

    def cancel(self, sequence: int) -> None:
        if self._open.pop(sequence, None) is not None and self._call is not None:
            self._items.put(stage_pb2.AdmitItem(sequence=sequence, cancel=True))

    async def close(self) -> None:
        self._items.cancel()
        self._end_stream(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE,
                                              details=f"the gateway closed its stream to stage 0 at {self.address}"))

    async def _send(self, batch) -> None:
        try:
            await self._write(batch)
        except Exception as e:  # noqa: BLE001 - a bug here must not leave its sequences waiting
            log.exception("writing to the stream to stage 0 at %s failed", self.address)
            self._end_stream(grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, details=f"gateway: {e!r}"))

    async def _write(self, batch) -> None:
        # An admission whose sequence ended before it was written (cancelled, or failed with a
        # broken stream) is not sent: nobody would read it, or cancel it.
        items = [item for item, _ in batch if item.cancel or item.sequence in self._open]
        settle(batch)
        if not items:
            return
        if self._call is None and not self._probed:
            self.per_sequence, self._probed = await self._lacks_generate_many(), True
        if self.per_sequence:
            for item in items:
                if item.sequence in self._open:
                    self._start_relay(self._open.pop(item.sequence))
            return
        if self._call is None:
            self._call, self._received = self._stub.GenerateMany(), False
            self._reader = asyncio.create_task(self._read(self._call), name=f"generate-reader-{self.address}")
        call = self._call
        self.num_messages, self.num_items = self.num_messages + 1, self.num_items + len(items)
        try:
            await call.write(stage_pb2.GenerateManyRequest(items=items))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            if self._call is call:  # the reader has not ended it yet
                self._end_stream(e if isinstance(e, grpc.aio.AioRpcError) else grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, details=f"the stream to stage 0 at {self.address} ended: {e}"))

    async def _read(self, call) -> None:
        try:
            async for message in call:
                self._received = True
                for item in message.items:
                    sequence = self._open.get(item.sequence)
                    if sequence is None:
                        continue  # cancelled: its last events reach nobody
                    if item.code:
                        del self._open[item.sequence]
                        sequence._deliver(grpc.aio.AioRpcError(_CODES.get(item.code, grpc.StatusCode.UNKNOWN),
                                                               details=item.message))
                        continue
                    if item.event.finish_reason:
                        del self._open[item.sequence]
                    sequence._deliver(item.event)
            error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE,
                                         details=f"stage 0 at {self.address} ended the GenerateMany stream")
        except grpc.aio.AioRpcError as e:
            error = e
        except asyncio.CancelledError:
            return  # close(): _end_stream fails what was open
        if self._call is call:
            self._end_stream(error)

    def _end_stream(self, error: grpc.aio.AioRpcError) -> None:
        call, self._call = self._call, None
        reader, self._reader = self._reader, None
        failed, self._open = self._open, {}
        if not self._received:  # nothing came: ask again before the next stream (a rollback may have come)
            self._probed = False
        if failed:
            log.warning("stream to stage 0 at %s ended (%s: %s); %d sequences on it fail over", self.address,
                        error.code().name, error.details(), len(failed))
        for sequence in failed.values():
            sequence._deliver(error)
        if call is not None:
            call.cancel()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()

    async def _lacks_generate_many(self, timeout_s: float = 5.0) -> bool:
        """Whether the replica answers GenerateMany UNIMPLEMENTED: asked with a stream that admits
        nothing and is closed at once, which a replica that has it ends OK. Any other answer (the
        replica down, or slow) counts as having it: the stream then fails, and its sequences fail over."""
        call = self._stub.GenerateMany()
        try:
            await call.done_writing()
            code = await asyncio.wait_for(call.code(), timeout_s)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError):
            call.cancel()
            return False
        if code == grpc.StatusCode.UNIMPLEMENTED:
            log.warning("stage 0 at %s has no GenerateMany (an older version): its sequences go on a "
                        "Generate stream each", self.address)
            return True
        return False

    def _start_relay(self, sequence: AdmittedSequence) -> None:
        sequence._relay = asyncio.create_task(self._relay(sequence), name=f"generate-{sequence.admit.request_id}")

    async def _relay(self, sequence: AdmittedSequence) -> None:
        """A sequence moved to a Generate stream of its own: its events, or the error that ends it."""
        call = self._stub.Generate(sequence.admit)
        try:
            async for event in call:
                sequence._deliver(event)
                if event.finish_reason:
                    return
            sequence._deliver(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, details=(
                f"stage 0 at {self.address} ended the Generate stream before its finish")))
        except grpc.aio.AioRpcError as e:
            sequence._deliver(e)
        except asyncio.CancelledError:
            call.cancel()


class StageChannels:
    """One channel per replica address, reused by every request routed there, and on it one
    GenerateMany stream."""

    def __init__(self) -> None:
        self._stubs: dict[str, tuple[grpc.aio.Channel, stage_pb2_grpc.StageWorkerStub]] = {}
        self._muxes: dict[str, GenerateMux] = {}

    def stub(self, address: str) -> stage_pb2_grpc.StageWorkerStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address)
            self._stubs[address] = (channel, stage_pb2_grpc.StageWorkerStub(channel))
        return self._stubs[address][1]

    def generate(self, address: str, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 downstream: list[str], generated_token_ids: list[int]) -> AdmittedSequence:
        """Admit one sequence on stage 0 at `address`; returns its TokenEvents as a Generate call
        gives them (iterate it; cancel() it to cancel the sequence along its route)."""
        if address not in self._muxes:
            self._muxes[address] = GenerateMux(self.stub(address), address)
        return self._muxes[address].generate(stage_pb2.AdmitRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling_to_wire(sampling),
            route=downstream, generated_token_ids=generated_token_ids))

    async def is_alive(self, address: str, timeout_s: float) -> bool:
        try:
            status = await self.stub(address).GetStatus(stage_pb2.StatusRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return not status.is_draining

    async def forget(self, keep: set[str]) -> None:
        """Close the channels of replicas no longer in the registry."""
        for address in [a for a in self._stubs if a not in keep]:
            mux = self._muxes.pop(address, None)
            if mux is not None:
                await mux.close()
            channel, _ = self._stubs.pop(address)
            await channel.close()

    async def close(self) -> None:
        await self.forget(set())
