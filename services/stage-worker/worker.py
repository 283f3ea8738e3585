"""A stage-worker replica without the gRPC: what the servicer calls, what tests can drive.

One thread — the loop — owns the engine and (on stage 0) the scheduler; everything else talks to
it through the inbox, so neither needs a lock. Outbound calls (activations to the next stage,
tokens back to stage 0, frees down a route) leave through the outbox, one ordered queue: a free
never overtakes the micro-batch sent before it.

Stage 0 keeps up to `num_stages` micro-batches in flight, splitting the sequences of a route
across them, so with PP stages every stage has work at once (FasterTransformer's micro-batching,
with continuous batching inside each micro-batch).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from collections import defaultdict

import grpc
import torch

from shardline.config import ConfigError
from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import StageBatch
from shardline.stage_worker.block_manager import OutOfBlocks
from shardline.stage_worker.convert import TokenEvent, batch_from_proto, batch_to_proto
from shardline.stage_worker.engine import StageEngine, stop_followers
from shardline.stage_worker.outbox import Outbox
from shardline.stage_worker.overlap import OverlappedStepper, wants_overlap
from shardline.stage_worker.scheduler import Scheduler
from shardline.stage_worker.sequence import FinishReason, Sequence, attempt_key, client_id
from shardline.v1 import common_pb2, stage_pb2
from shardline.wire import DTYPE_NAMES, WireError, tensor_from_bytes, tensor_to_bytes

log = logging.getLogger("shardline.stage_worker")

class AdmissionError(ValueError):
    """A sequence cannot be admitted; `code` is the gRPC status to answer with."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


class StageWorker:
    def __init__(self, engine: StageEngine, address: str, replica_id: str, model_name: str,
                 orphan_timeout_s: float = 300.0) -> None:
        self.engine, self.address, self.replica_id, self.model_name = engine, address, replica_id, model_name
        self.stage, self.num_stages = engine.stage, engine.manifest.pp
        self.is_first, self.is_last = engine.is_first, engine.is_last
        self.hidden_size = engine.model_config.hidden_size
        self.is_draining = False
        self.outbox = Outbox()
        self._inbox: queue.Queue = queue.Queue()
        self._stopped = threading.Event()
        self.max_micro_batches_in_flight = 0
        # Stages > 0: when a sequence's stage 0 dies, no Free ever comes; sequences that no
        # micro-batch touched for this long give their KV blocks back.
        self.orphan_timeout_s = orphan_timeout_s
        self._last_seen: dict[str, float] = {}
        self._next_reap = time.monotonic() + orphan_timeout_s
        if self.is_first:
            overlap = wants_overlap(engine)
            self.scheduler = Scheduler.for_engine(engine, lookahead=1 if overlap else 0)
            self.stepper = OverlappedStepper(engine, self.scheduler) if overlap else None
            self._streams: dict[str, queue.Queue] = {}
            self._in_flight: dict[int, StageBatch] = {}
            # Each route keeps up to num_stages micro-batches in flight, whatever the others do: a
            # replica down one route that stops answering holds up only that route's.
            self._in_flight_routes: dict[int, tuple[str, ...]] = {}
            # micro-batch id -> (request id, route) of cancelled sequences it still holds downstream
            self._deferred_free: dict[int, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
            self._routes: dict[str, tuple[str, ...]] = {}
            self._ids = itertools.count(1)
            # Attempts: keys unique across replicas and restarts (see sequence.attempt_key), and
            # the current attempt of each request id.
            self._attempt_prefix, self._attempts = uuid.uuid4().hex[:8], itertools.count(1)
            self._attempt_of: dict[str, str] = {}
        self._thread = threading.Thread(target=self._loop, name=f"stage{self.stage}-loop", daemon=True)
        self._thread.start()

    # -- called from servicer threads ------------------------------------------------------------

    def admit(self, request_id: str, prompt: list[int], sampling: SamplingParams, route: list[str],
              generated: list[int], events=None) -> queue.Queue:
        """Stage 0: queue a sequence; its TokenEvents arrive on the returned queue (`events`, where
        given: anything with put(), which then names this attempt to cancel)."""
        if not self.is_first:
            raise AdmissionError(f"this replica serves stage {self.stage}; send Generate to a stage-0 replica",
                                 grpc.StatusCode.FAILED_PRECONDITION)
        if self.is_draining:
            raise AdmissionError("replica is draining (shutting down); choose another route",
                                 grpc.StatusCode.UNAVAILABLE)
        if len(route) != self.num_stages - 1:
            raise AdmissionError(f"route names {len(route)} downstream replicas; this model has "
                                 f"{self.num_stages} stages, so give {self.num_stages - 1}")
        if not prompt:
            raise AdmissionError("prompt_token_ids is empty; send at least one token")
        vocab = self.engine.model_config.vocab_size
        bad = [t for t in prompt + generated if not 0 <= t < vocab]
        if bad:
            raise AdmissionError(f"token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}")
        total = len(prompt) + sampling.max_tokens
        if total > self.engine.max_model_len:
            raise AdmissionError(f"prompt ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) = {total} "
                                 f"exceeds the context of {self.engine.max_model_len} tokens",
                                 grpc.StatusCode.OUT_OF_RANGE)
        if len(generated) >= sampling.max_tokens:
            raise AdmissionError(f"resume with {len(generated)} generated tokens has nothing left to do "
                                 f"(max_tokens {sampling.max_tokens})")
        key = attempt_key(request_id, f"{self._attempt_prefix}{next(self._attempts)}")
        seq = Sequence(key, list(prompt), sampling, self.engine.model_config.eos_token_ids,
                       output_token_ids=list(generated), route=tuple(route))
        events = queue.Queue() if events is None else events
        self._inbox.put(("admit", seq, events))
        return events

    def cancel(self, request_id: str, events: queue.Queue | None = None) -> None:
        """End the request's attempt here; given its events queue (what admit returned), only that
        attempt: a later admit of the same id (a resume onto this replica) is not touched."""
        self._inbox.put(("cancel", request_id, events))

    def forward(self, msg: stage_pb2.MicroBatch) -> int:
        """Stage > 0: validate a micro-batch's activations and queue it. Returns the queue depth."""
        if self.is_first:
            raise AdmissionError("stage 0 takes no activations; Forward goes to stages 1..p-1",
                                 grpc.StatusCode.FAILED_PRECONDITION)
        if len(msg.route) != self.num_stages - 1 - self.stage:
            raise AdmissionError(f"micro-batch route has {len(msg.route)} replicas after stage {self.stage}; "
                                 f"expected {self.num_stages - 1 - self.stage}")
        num_tokens = sum(c.num_tokens for c in msg.sequences)
        expected = [num_tokens, self.hidden_size]
        if list(msg.hidden.shape) != expected:
            raise AdmissionError(f"hidden shape {list(msg.hidden.shape)} != {expected} "
                                 f"(tokens in the micro-batch x hidden size)")
        if msg.hidden.dtype != DTYPE_NAMES[self.engine.dtype]:
            raise AdmissionError(f"hidden dtype {msg.hidden.dtype!r}; this stage runs {DTYPE_NAMES[self.engine.dtype]}")
        try:
            hidden = tensor_from_bytes(msg.hidden.data, msg.hidden.shape, msg.hidden.dtype)
        except WireError as e:
            raise AdmissionError(str(e)) from e
        self._inbox.put(("forward", msg, batch_from_proto(msg.sequences), hidden))
        return self._inbox.qsize()

    def return_tokens(self, msg: stage_pb2.SampledTokens) -> None:
        self._inbox.put(("tokens", msg))

    def free(self, request_ids: list[str], route: list[str]) -> None:
        self._inbox.put(("free", list(request_ids), list(route)))

    def status(self) -> dict:
        s = self.engine.status()
        num_sequences = len(s["running"])
        s["running"] = sorted({client_id(k) for k in s["running"]})  # request ids, not attempt keys
        s["free_blocks"] = min(s["free_blocks"], self.scheduler.num_free_blocks) if self.is_first else s["free_blocks"]
        if self.is_first:
            s["num_running"] = len(self.scheduler.running) + len(self.scheduler.waiting)
        else:
            s["num_running"] = num_sequences
        s["max_micro_batches_in_flight"] = self.max_micro_batches_in_flight
        s["is_draining"] = self.is_draining
        return s

    def drain(self, timeout_s: float) -> None:
        """Stop taking sequences, let running ones finish, then hand the rest back with an error
        the gateway answers by resubmitting them elsewhere."""
        self.is_draining = True
        deadline = time.monotonic() + timeout_s
        while self.is_first and time.monotonic() < deadline:
            if not self.scheduler.has_work and not self._in_flight:
                break
            time.sleep(0.05)
        if self.is_first:
            self._inbox.put(("abort_all", "replica shut down before the sequence finished; resubmit elsewhere"))

    def stop(self) -> None:
        self._inbox.put(("stop",))
        self._thread.join(timeout=10)
        self.outbox.close()

    # -- the loop (one thread owns engine and scheduler) -----------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                idle = not self.is_first or not self._can_schedule()
                try:
                    cmd = self._inbox.get(timeout=0.5) if idle else self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    self._handle(cmd)
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self.is_first and not self._stopped.is_set():
                    self._schedule_and_run()
                elif not self.is_first and time.monotonic() >= self._next_reap:
                    self._reap_orphans()
        except Exception:  # noqa: BLE001 - a dead loop must be loud
            log.exception("stage %d loop died", self.stage)
            raise
        finally:
            stop_followers(self.engine.tp)

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "stop":
            self._stopped.set()
        elif kind == "admit":
            _, seq, events = cmd
            rid = client_id(seq.request_id)
            if rid in self._attempt_of:
                # The gateway runs one attempt of a request at a time: a new one for an id still
                # running here (a resume onto this replica) supersedes the old.
                self._cancel(self._attempt_of[rid])
            try:
                self.scheduler.add(seq)
            except ValueError as e:
                events.put(TokenEvent(rid, None, len(seq.output_token_ids), FinishReason.ERROR, str(e)))
                return
            self._attempt_of[rid] = seq.request_id
            self._streams[seq.request_id] = events
            self._routes[seq.request_id] = seq.route
        elif kind == "cancel":
            _, rid, events = cmd
            key = self._attempt_of.get(rid)
            if key is not None and (events is None or self._streams.get(key) is events):
                self._cancel(key)  # else that attempt ended already, and the id may name a later one
        elif kind == "tokens":
            self._on_returned(cmd[1])
        elif kind == "mb_error":
            _, mb_id, error = cmd
            batch = self._pop_in_flight(mb_id)
            if batch is not None:
                self._finish_failed(self.scheduler.on_error(batch, error))
                self._release_deferred(mb_id)
        elif kind == "forward":
            self._run_forwarded(*cmd[1:])
        elif kind == "free":
            _, ids, route = cmd
            self.engine.free(ids)
            for rid in ids:
                self._last_seen.pop(rid, None)
            if route:
                self.outbox.send(route[0], "Free", stage_pb2.FreeRequest(request_ids=ids, route=route[1:]))
        elif kind == "abort_all":
            for rid in list(self.scheduler.running) + [s.request_id for s in self.scheduler.waiting]:
                seq = self.scheduler.cancel(rid)
                if seq is not None:
                    self._emit_end(seq, FinishReason.ERROR, cmd[1])
            self._flush_frees()

    # stage 0 --------------------------------------------------------------------------------------

    def _can_schedule(self) -> bool:
        if self.stepper is not None and self.stepper.has_launched:
            return True
        return any(self._room_on(route) for route in self.scheduler.routes_ready())

    def _room_on(self, route: tuple[str, ...]) -> bool:
        return sum(r == route for r in self._in_flight_routes.values()) < self.num_stages

    def _pop_in_flight(self, mb_id: int) -> StageBatch | None:
        self._in_flight_routes.pop(mb_id, None)
        return self._in_flight.pop(mb_id, None)

    def _schedule_and_run(self) -> None:
        if self.stepper is not None:
            batch = self.scheduler.schedule()
            try:
                done = self.stepper.step(batch)
            except (OutOfBlocks, ConfigError) as e:
                self._finish_failed(self.scheduler.on_error(batch, f"stage 0: {e}"))
                return
            if done is not None:
                self._deliver(*done)
            return
        for route in self.scheduler.routes_ready():
            if not self._room_on(route):
                continue
            # Split the route's sequences over num_stages micro-batches so every stage has one.
            per_micro_batch = -(-self.scheduler.num_running_on(route) // self.num_stages)
            batch = self.scheduler.schedule(route, max_seqs=per_micro_batch)
            if not batch.chunks:
                continue
            ids = self.scheduler.input_ids(batch)[0]
            try:
                out = self.engine.step(batch, ids)
            except (OutOfBlocks, ConfigError) as e:
                self._finish_failed(self.scheduler.on_error(batch, f"stage 0: {e}"))
                continue
            if self.is_last:
                self._deliver(batch, out)
                continue
            mb_id = next(self._ids)
            self._in_flight[mb_id], self._in_flight_routes[mb_id] = batch, route
            self.max_micro_batches_in_flight = max(self.max_micro_batches_in_flight, len(self._in_flight))
            data, shape, dtype = tensor_to_bytes(out)
            msg = stage_pb2.MicroBatch(micro_batch_id=mb_id, origin=self.address, route=list(route[1:]),
                                       sequences=batch_to_proto(batch),
                                       hidden=common_pb2.Tensor(data=data, shape=shape, dtype=dtype))
            self.outbox.send(route[0], "Forward", msg,
                             on_error=lambda err, mb_id=mb_id: self._inbox.put(("mb_error", mb_id, err)))

    def _on_returned(self, msg: stage_pb2.SampledTokens) -> None:
        batch = self._pop_in_flight(msg.micro_batch_id)
        if batch is None:
            return
        if msg.HasField("error"):
            self._finish_failed(self.scheduler.on_error(batch, msg.error))
        else:
            by_id = {t.request_id: t.token_id for t in msg.tokens}
            self._deliver(batch, [by_id.get(c.request_id, -1) for c in batch.sampled])
        self._release_deferred(msg.micro_batch_id)

    def _deliver(self, batch: StageBatch, tokens: list[int]) -> None:
        for seq in self.scheduler.on_tokens(batch, tokens):
            index = len(seq.output_token_ids) - 1
            events = self._streams.get(seq.request_id)
            if events is not None:
                events.put(TokenEvent(client_id(seq.request_id), seq.output_token_ids[-1], index, seq.finish_reason))
            if seq.is_finished:
                self._forget(seq.request_id)
        self._flush_frees()

    def _cancel(self, key: str) -> None:
        """End one attempt (by its key)."""
        holding = [i for i, b in self._in_flight.items() if any(c.request_id == key for c in b.chunks)]
        if holding:
            # A micro-batch with it is still downstream: free there only after the last one comes
            # back, or a late micro-batch would allocate the blocks again.
            self._deferred_free[max(holding)].append((key, self._routes.pop(key, ())))
        seq = self.scheduler.cancel(key)
        if seq is not None:
            self._emit_end(seq, FinishReason.CANCELLED, "")
        self._flush_frees()

    def _finish_failed(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._emit_end(seq, FinishReason.ERROR, seq.error or "failed")
        self._flush_frees()

    def _emit_end(self, seq: Sequence, reason: FinishReason, error: str) -> None:
        events = self._streams.get(seq.request_id)
        if events is not None:
            events.put(TokenEvent(client_id(seq.request_id), None, len(seq.output_token_ids), reason, error))
        self._forget(seq.request_id)

    def _forget(self, key: str) -> None:
        self._streams.pop(key, None)
        rid = client_id(key)
        if self._attempt_of.get(rid) == key:
            del self._attempt_of[rid]

    def _flush_frees(self) -> None:
        ids = self.scheduler.take_pending_free()
        if not ids:
            return
        self.engine.free(ids)
        by_route: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for rid in ids:
            route = self._routes.pop(rid, ())  # none when _cancel deferred it
            if route:
                by_route[route].append(rid)
        for route, rids in by_route.items():
            self.outbox.send(route[0], "Free", stage_pb2.FreeRequest(request_ids=rids, route=list(route[1:])))

    def _release_deferred(self, mb_id: int) -> None:
        by_route: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for rid, route in self._deferred_free.pop(mb_id, []):
            if route:
                by_route[route].append(rid)
        for route, rids in by_route.items():
            self.outbox.send(route[0], "Free", stage_pb2.FreeRequest(request_ids=rids, route=list(route[1:])))

    # stages 1..p-1 --------------------------------------------------------------------------------

    def _reap_orphans(self) -> None:
        now = time.monotonic()
        self._next_reap = now + min(self.orphan_timeout_s, 10.0)
        stale = [rid for rid, seen in self._last_seen.items() if now - seen > self.orphan_timeout_s]
        if stale:
            log.warning("freeing %d sequences untouched for %.0fs (their stage 0 is gone): %s",
                        len(stale), self.orphan_timeout_s, stale[:5])
            self.engine.free(stale)
            for rid in stale:
                del self._last_seen[rid]

    def _run_forwarded(self, msg: stage_pb2.MicroBatch, batch: StageBatch, hidden: torch.Tensor) -> None:
        def report(error: str) -> None:
            self.outbox.send(msg.origin, "ReturnTokens",
                             stage_pb2.SampledTokens(micro_batch_id=msg.micro_batch_id, error=error))

        now = time.monotonic()
        for c in batch.chunks:
            self._last_seen[c.request_id] = now
        try:
            out = self.engine.step(batch, hidden)
        except (OutOfBlocks, ConfigError) as e:
            report(f"stage {self.stage} replica {self.address}: {e}")
            return
        if self.is_last:
            tokens = [stage_pb2.SampledToken(request_id=c.request_id, token_id=t) for c, t in zip(batch.sampled, out)]
            self.outbox.send(msg.origin, "ReturnTokens",
                             stage_pb2.SampledTokens(micro_batch_id=msg.micro_batch_id, tokens=tokens))
            return
        data, shape, dtype = tensor_to_bytes(out)
        nxt = stage_pb2.MicroBatch(micro_batch_id=msg.micro_batch_id, origin=msg.origin, route=list(msg.route[1:]),
                                   sequences=msg.sequences,
                                   hidden=common_pb2.Tensor(data=data, shape=shape, dtype=dtype))
        self.outbox.send(msg.route[0], "Forward", nxt, on_error=report)
