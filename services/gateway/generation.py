"""One request's life after it is accepted: queue -> route -> stage-0 stream -> detokenize -> deltas.

Failover: when the stage-0 stream breaks before the sequence finishes (UNAVAILABLE, a stream that
ends without a finish event, an error event, or a route replica vanishing from the registry), the
request is resubmitted on a new route with generated_token_ids = the tokens received so far. The
worker recomputes them and continues; TokenEvent.index lets us drop anything it sends twice, so
the client sees no gap and no duplicate. Sampling is a function of (seed, position), so a resumed
sequence continues exactly as the first route would have.

The detokenizer stream lives as long as the request, across routes: the text it holds back
(incomplete UTF-8, a possible stop string) survives a failover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from redis.exceptions import RedisError

from shardline.sampling import SamplingParams
from shardline.v1 import common_pb2

from . import records
from .errors import GatewayError, Internal, InvalidArgument, OutOfRange, Unavailable
from .admission import Slot
from .routing import Route
from .tokenizer_client import Detokenizer

if TYPE_CHECKING:
    from .service import Gateway

log = logging.getLogger("shardline.gateway")

# Stage-0 failures after which the request is resumed elsewhere; any other status is final.
RESUMABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                   grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED)
FINISH_REASONS = {common_pb2.FINISH_REASON_LENGTH: "LENGTH", common_pb2.FINISH_REASON_STOP: "STOP",
                  common_pb2.FINISH_REASON_CANCELLED: "CANCELLED", common_pb2.FINISH_REASON_ERROR: "ERROR"}


@dataclass
class Chunk:
    text: str
    token_ids: list[int]


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Timings:
    queue_s: float = 0.0
    time_to_first_token_s: float = 0.0
    total_s: float = 0.0
    decode_tokens_per_s: float = 0.0


@dataclass
class Complete:
    finish_reason: str  # "LENGTH" | "STOP" | "CANCELLED"
    matched_stop: str
    usage: Usage
    timings: Timings


async def collect(events) -> tuple[str, Complete]:
    """A generation's whole text and its Complete, from its events (a non-streaming answer)."""
    text, complete = [], None
    async for event in events:
        if isinstance(event, Chunk):
            text.append(event.text)
        else:
            complete = event
    return "".join(text), complete


def finish_reason(c: Complete) -> str:
    """The finish reason as the HTTP doors and the v2 protocol spell it: length, stop, cancelled."""
    return c.finish_reason.lower()


class RouteBroken(Exception):
    """The current route cannot continue the sequence; resume it on another."""


@dataclass
class Generation:
    gateway: "Gateway"
    request_id: str
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stop: list[str]
    eos_token_ids: tuple[int, ...]
    queued_at: float  # unix time
    generated: list[int] = field(default_factory=list)
    route: Route | None = None
    num_resumes: int = 0
    first_token_at: float = 0.0  # unix time of the first generated token; 0 = none yet
    _task: asyncio.Task | None = None
    _call: object | None = None  # the sequence on the stage-0 stream (stage_client.AdmittedSequence)
    _cancel_requested: bool = False
    _at_yield: bool = False  # suspended at a yield: the consumer, not events(), is running
    _broken_reason: str = ""
    _detok: Detokenizer | None = None
    _slot: Slot | None = None
    _has_ended: bool = False
    _num_recorded: int = 0  # generated ids already written to the Redis record

    # -- control from outside (Cancel RPC, registry watchdog) ---------------------------------------

    def cancel(self) -> None:
        """Cancel wherever the request is (queued, waiting for a route, streaming).

        Inside one of our awaits, the task is cancelled and events() turns that into a final
        Complete(CANCELLED). Suspended at a yield, the consumer's task is elsewhere (writing to
        the client): cancelling it would look like a client disconnect, so only the flag is set and
        checked when the consumer asks for the next event.
        """
        if not self._cancel_requested:
            self._cancel_requested = True
            if self._task is not None and not self._at_yield and self._task is not asyncio.current_task():
                self._task.cancel()

    def _after_yield(self) -> None:
        self._at_yield = False
        if self._cancel_requested:
            raise asyncio.CancelledError

    def route_vanished(self, address: str) -> None:
        """A replica of the current route left the registry: break the stream, resume elsewhere."""
        if self._call is not None and not self._broken_reason:
            self._broken_reason = f"replica {address} vanished from the registry"
            self._call.cancel()

    # -- the request --------------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Chunk | Complete]:
        """Chunks, then one Complete. Raises GatewayError on failure; closing the iterator (client
        gone) cancels the request downstream."""
        gw = self.gateway
        self._task = asyncio.current_task()
        self._detok = detok = gw.tokenizer(self.model).detokenizer(
            self.stop, self.prompt_token_ids[-gw.config.detokenize_prefix_tokens:])
        state, reason, error, matched_stop = records.FAILED, "ERROR", "", ""
        try:
            if self._cancel_requested:
                raise asyncio.CancelledError
            self._slot = await gw.admission.acquire()
            finish = ""
            while not finish:
                try:
                    async with aclosing(self._stream_from_a_route()) as stream:
                        async for token_ids, finish in stream:
                            if not token_ids:
                                continue
                            response = await detok.push(token_ids)
                            if response.finished:  # a stop string matched: the worker need not go on
                                # The match may complete a token or two before these (it waits for
                                # whole characters); ids past it are not part of the completion.
                                first = len(self.generated) - len(token_ids)  # index of token_ids[0]
                                kept = token_ids[:max(response.num_tokens - first, 0)]
                                del self.generated[response.num_tokens:]
                                self._at_yield = True
                                yield Chunk(response.text, kept)
                                self._after_yield()
                                finish, matched_stop = "STOP", response.matched_stop
                                break
                            self._at_yield = True
                            yield Chunk(response.text, token_ids)
                            self._after_yield()
                except RouteBroken as e:
                    await self._resume_or_fail(str(e))
            flush = await detok.finish()
            if flush is not None and (flush.text or flush.matched_stop):
                matched_stop = matched_stop or flush.matched_stop
                self._at_yield = True
                yield Chunk(flush.text, [])
                self._after_yield()
            complete = self._complete(finish, matched_stop)
            await self._end(records.FINISHED, finish, "")  # recorded before the client hears of it
            yield complete
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (self._cancel_requested and task.uncancel() == 0):
                state, reason, error = records.CANCELLED, "CANCELLED", "the client went away"
                raise  # the consumer is gone (client disconnect): cleanup below, then propagate
            complete = self._complete("CANCELLED", "")
            await self._end(records.CANCELLED, "CANCELLED", "cancelled by request")
            yield complete
        except GeneratorExit:
            state, reason, error = records.CANCELLED, "CANCELLED", "the client went away"
            raise
        except GatewayError as e:
            error = e.message
            raise
        except Exception as e:
            log.exception("request %s failed", self.request_id)
            error = f"internal error: {e}"
            raise Internal(f"request {self.request_id} failed inside the gateway: {e}") from e
        finally:
            await self._end(state, reason, error)

    async def _end(self, state: str, reason: str, error: str) -> None:
        """Once, however the request ends: cancel the sequence on the stage-0 stream (this frees
        its KV cache along the route), give the slot back, write the final record."""
        if self._has_ended:
            return
        self._has_ended = True
        self._cancel_stage0()
        if self._detok is not None:
            self._detok.close()
        if self._slot is not None:
            self._slot.release()
        await self.gateway._finished(self, state, reason, error)

    async def _stream_from_a_route(self) -> AsyncIterator[tuple[list[int], str]]:
        """(new token ids, finish reason or "") from one route, in index order.

        The ids are every token stage 0 has sent that the gateway has not handled yet: one at a
        time while the gateway keeps up, several at once when it falls behind, so that one
        detokenize call and one chunk to the client serve them all (a busy gateway's cost per
        token falls as its load rises). Raises RouteBroken when the route fails before the
        sequence finishes.
        """
        gw = self.gateway
        if self._finished_already():
            yield [], self._finished_already()
            return
        self.route = await gw.wait_for_route(self.model, self.request_id)
        self._broken_reason = ""
        # Not waited for: stage 0 gets the sequence a Redis round trip sooner, and the record's later
        # writes queue behind this one.
        gw.records.running(self.request_id, self.route.addresses, self.num_resumes).add_done_callback(
            self._log_record_failure)
        self._call = gw.stages.generate(self.route.addresses[0], self.request_id, self.prompt_token_ids,
                                        self.sampling, self.route.downstream, list(self.generated))
        received: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(_read_stream(self._call, received), name=f"stage0-{self.request_id}")
        try:
            while True:
                events = [await received.get()]
                while not received.empty():
                    events.append(received.get_nowait())
                token_ids, finish, broken = [], "", None
                for event in events:
                    if isinstance(event, BaseException) or event is None:
                        broken = event or RouteBroken(f"stage 0 at {self.route.addresses[0]} ended the stream "
                                                      f"before the sequence finished")
                        break
                    finish = FINISH_REASONS.get(event.finish_reason, "")
                    if finish in ("ERROR", "CANCELLED"):
                        # We cancel only by cancelling the sequence, after which we read nothing: a
                        # CANCELLED here, like an ERROR (a drained replica hands its sequences back
                        # this way), means this route gave up on the sequence, not the client.
                        broken = RouteBroken(f"stage 0 at {self.route.addresses[0]} ended the sequence: "
                                             f"{finish} {event.error}")
                        finish = ""
                        break
                    if event.HasField("token_id"):
                        if event.index < len(self.generated):
                            continue  # already delivered before a resume
                        if event.index > len(self.generated):
                            broken = RouteBroken(f"stage 0 skipped tokens {len(self.generated)}..{event.index - 1}")
                            finish = ""
                            break
                        token_ids.append(event.token_id)
                        await self._record_token(event.token_id)
                    if finish:
                        break
                if token_ids or finish:
                    yield token_ids, finish  # the ids before a break reach the client before the resume
                if broken is not None:
                    raise broken
                if finish:
                    return
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # our task is being cancelled, not just the call
            raise RouteBroken(self._broken_reason or "the stage-0 call was cancelled")
        except grpc.aio.AioRpcError as e:
            if e.code() in RESUMABLE_CODES:
                raise RouteBroken(f"stage 0 at {self.route.addresses[0]}: {e.code().name}: {e.details()}")
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(f"stage 0 rejected the request: {e.details()}")
            if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                raise OutOfRange(f"stage 0 rejected the request: {e.details()}")
            raise Internal(f"stage 0 at {self.route.addresses[0]} failed: {e.code().name}: {e.details()}")
        finally:
            reader.cancel()
            self._cancel_stage0()

    def _finished_already(self) -> str:
        """A resume is pointless when the tokens so far already end the sequence."""
        if self.generated and not self.sampling.ignore_eos and \
                self.generated[-1] in (*self.eos_token_ids, *self.sampling.stop_token_ids):
            return "STOP"
        if len(self.generated) >= self.sampling.max_tokens:
            return "LENGTH"
        return ""

    async def _resume_or_fail(self, why: str) -> None:
        gw = self.gateway
        await self.flush_record()
        self.num_resumes += 1
        log.warning("request %s: route %s broke after %d tokens (%s); resume %d/%d", self.request_id,
                    self.route.addresses if self.route else [], len(self.generated), why, self.num_resumes,
                    gw.config.max_resumes)
        if self.route is not None:
            await gw.route_broke(self.route, self.request_id)
        if self.num_resumes > gw.config.max_resumes:
            raise Unavailable(f"request {self.request_id} failed after {self.num_resumes - 1} resumes; last "
                              f"failure: {why}")

    async def _record_token(self, token_id: int) -> None:
        """Keep the token. The first is written to the Redis record at once; later ones go with
        the gateway's next batched write (Gateway._flush_records, every record_interval_s, one
        transaction for every running request: a write per token per request cost more than the
        rest of the gateway's per-token work)."""
        if not self.generated:
            self.first_token_at = time.time()
            self.generated.append(token_id)
            await self.flush_record()
            return
        self.generated.append(token_id)
        self.gateway.unrecorded[self.request_id] = self

    def take_unrecorded(self) -> tuple[str, list[int], int, float | None] | None:
        """The ids not yet in the Redis record, as RecordStore.append_tokens_many takes them, now
        counted as recorded; None when there are none. Call with gateway.record_lock held, so that
        a request's writes reach Redis in order."""
        num_recorded = self._num_recorded
        if num_recorded >= len(self.generated):
            return None
        self._num_recorded = len(self.generated)
        return (self.request_id, self.generated[num_recorded:], len(self.generated),
                self.first_token_at if num_recorded == 0 else None)

    async def flush_record(self) -> None:
        """Write the generated ids not yet in the Redis record (a resume and the end need it whole)."""
        async with self.gateway.record_lock:
            append = self.take_unrecorded()
            if append is not None:
                await self._best_effort(self.gateway.records.append_tokens(*append))

    async def _best_effort(self, record_write) -> None:
        """A running request outlives a Redis blip: its record falls behind, the client does not."""
        try:
            await record_write
        except RedisError as e:
            self._record_write_failed(e)

    def _log_record_failure(self, written: asyncio.Future) -> None:
        """_best_effort for a write nobody waits for."""
        if not written.cancelled() and written.exception() is not None:
            self._record_write_failed(written.exception())

    def _record_write_failed(self, e: BaseException) -> None:
        log.warning("request %s: could not update its record in Redis: %s", self.request_id, e)

    def _cancel_stage0(self) -> None:
        call, self._call = self._call, None
        if call is not None and not call.done():
            call.cancel()

    @property
    def time_to_first_token_s(self) -> float:
        """Acceptance to the first generated token; 0 before it."""
        return max(0.0, self.first_token_at - self.queued_at) if self.first_token_at else 0.0

    @property
    def elapsed_s(self) -> float:
        """Acceptance to now."""
        return max(0.0, time.time() - self.queued_at)

    def _complete(self, reason: str, matched_stop: str) -> Complete:
        ttft, total = self.time_to_first_token_s, self.elapsed_s
        admitted = self.gateway.admitted_at.get(self.request_id, 0.0)
        n = len(self.generated)
        decode = (n - 1) / (total - ttft) if n > 1 and total > ttft else 0.0
        return Complete(reason, matched_stop, Usage(len(self.prompt_token_ids), n),
                        Timings(queue_s=max(0.0, admitted - self.queued_at) if admitted else 0.0,
                                time_to_first_token_s=ttft, total_s=total, decode_tokens_per_s=decode))


async def _read_stream(call, received: asyncio.Queue) -> None:
    """Move a stage-0 stream's events into `received` as they arrive; then None at its end, or
    the exception that ended it (a cancelled call raises CancelledError in the reader)."""
    try:
        async for event in call:
            received.put_nowait(event)
        received.put_nowait(None)
    except asyncio.CancelledError as e:
        if asyncio.current_task().cancelling():
            return  # the reader task itself was cancelled: nobody reads the queue any more
        received.put_nowait(e)
    except Exception as e:  # noqa: BLE001 - handed to the reader of the queue, which raises it
        received.put_nowait(e)
