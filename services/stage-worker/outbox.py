"""Ordered outbound RPCs of a stage replica (activations, tokens, frees): one lane a destination.

Order matters only between messages to one replica (a Free must not overtake the micro-batch that
still holds the sequence; Frees further down the route travel through the next replica's own
outbox). So each destination gets a lane of its own, a queue and a thread: a replica that stops
answering holds up only what is sent to it, for its call timeout each, and never the sequences
of other routes.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import grpc

from shardline.v1 import stage_pb2_grpc

log = logging.getLogger("shardline.stage_worker")


class Outbox:
    """Ordered outbound RPCs per destination; a failed call reports through its `on_error`."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._lanes: dict[str, _Lane] = {}
        self._lock = threading.Lock()  # senders are the loop thread and gRPC handler threads

    def send(self, address: str, method: str, request, on_error: Callable[[str], None] | None = None) -> None:
        with self._lock:
            lane = self._lanes.get(address)
            if lane is None:
                lane = self._lanes[address] = _Lane(address, self.timeout_s)
        lane.queue.put((method, request, on_error))

    def close(self) -> None:
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.queue.put(None)
        for lane in lanes:
            lane.thread.join(timeout=5)
            lane.channel.close()


class _Lane:
    def __init__(self, address: str, timeout_s: float) -> None:
        self.address, self.timeout_s = address, timeout_s
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                               ("grpc.max_receive_message_length", -1)])
        self.stub = stage_pb2_grpc.StageWorkerStub(self.channel)
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"outbox-{address}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            method, request, on_error = item
            try:
                getattr(self.stub, method)(request, timeout=self.timeout_s)
            except grpc.RpcError as e:
                log.warning("%s to %s failed: %s", method, self.address, e.code())
                if on_error is not None:
                    on_error(f"{method} to stage replica {self.address} failed: {e.code().name}: {e.details()}")
