"""Admission control: at most `max_running` requests run at once, at most `max_queued` wait (FIFO).

A request that finds the queue full is refused at once with RESOURCE_EXHAUSTED and a retry hint
estimated from how fast running requests have recently been finishing. The queue never sees a
token; it is only slots.
"""

from __future__ import annotations

import asyncio
import collections
import time

from .config import AdmissionConfig
from .errors import ResourceExhausted

MIN_RETRY_AFTER_S, MAX_RETRY_AFTER_S = 0.1, 30.0


class AdmissionQueue:
    def __init__(self, config: AdmissionConfig) -> None:
        self.max_running, self.max_queued = config.max_running, config.max_queued
        self.num_running = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._mean_run_s = 1.0  # exponential moving average of how long a slot is held

    @property
    def num_queued(self) -> int:
        return len(self._waiters)

    def retry_after_s(self) -> float:
        """Expected wait until a queued slot would free up: the queue drains max_running at a time."""
        waves = (self.num_queued + 1) / self.max_running
        return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, waves * self._mean_run_s))

    def check(self) -> None:
        """Refuse now if acquire() could not even queue; lets callers refuse before doing work."""
        if self.num_running >= self.max_running and self.num_queued >= self.max_queued:
            retry = self.retry_after_s()
            raise ResourceExhausted(
                f"the gateway is full: {self.num_running} requests running (max_running "
                f"{self.max_running}) and {self.num_queued} queued (max_queued {self.max_queued}); "
                f"retry after {retry:.1f}s", retry_after_s=retry)

    async def acquire(self) -> "Slot":
        """Wait for a running slot (FIFO). Raises ResourceExhausted when the queue is full.

        Cancelling the waiting task leaves the queue as if it had never come.
        """
        if self.num_running < self.max_running and not self._waiters:
            self.num_running += 1
            return Slot(self)
        self.check()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over: num_running already counts us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot came in the same instant the caller gave up
            else:
                self._waiters.remove(waiter)
            raise
        return Slot(self)

    def _release(self, held_s: float | None = None) -> None:
        if held_s is not None:
            self._mean_run_s = 0.9 * self._mean_run_s + 0.1 * held_s
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over; num_running is unchanged
                return
        self.num_running -= 1


class Slot:
    """One running slot; release exactly once (use as a context manager)."""

    def __init__(self, queue: AdmissionQueue) -> None:
        self._queue, self._acquired_at, self._released = queue, time.monotonic(), False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue._release(time.monotonic() - self._acquired_at)

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
