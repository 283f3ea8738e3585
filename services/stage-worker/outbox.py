"""Ordered outbound RPCs of a stage replica (activations, tokens, frees), from one thread."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import grpc

from shardline.v1 import stage_pb2_grpc

log = logging.getLogger("shardline.stage_worker")


class Outbox:
    """Ordered outbound RPCs from one thread; a failed call reports through its `on_error`."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._stubs: dict[str, stage_pb2_grpc.StageWorkerStub] = {}
        self._channels: list[grpc.Channel] = []
        self.timeout_s = timeout_s
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._thread.start()

    def send(self, address: str, method: str, request, on_error: Callable[[str], None] | None = None) -> None:
        self._queue.put((address, method, request, on_error))

    def _stub(self, address: str) -> stage_pb2_grpc.StageWorkerStub:
        if address not in self._stubs:
            channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                              ("grpc.max_receive_message_length", -1)])
            self._channels.append(channel)
            self._stubs[address] = stage_pb2_grpc.StageWorkerStub(channel)
        return self._stubs[address]

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            address, method, request, on_error = item
            try:
                getattr(self._stub(address), method)(request, timeout=self.timeout_s)
            except grpc.RpcError as e:
                log.warning("%s to %s failed: %s", method, address, e.code())
                if on_error is not None:
                    on_error(f"{method} to stage replica {address} failed: {e.code().name}: {e.details()}")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        for c in self._channels:
            c.close()
