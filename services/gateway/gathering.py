"""Sending what many requests hand in together: one round trip a batch, not one an item.

The gateway's Redis record writes and its detokenize items are small messages that every running
request makes, many times. Sent one by one, each costs the event loop a round trip's work (redis-py
or gRPC: about half a millisecond), and a burst of requests queues up behind them. A Gatherer sends
the first item at once and gathers whatever is handed in while that send is in flight into the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
Batch = list[tuple[T, "asyncio.Future | None"]]


class Gatherer(Generic[T]):
    """`send(batch)` sends [(item, its answer's future, or None where no answer is wanted)] and
    settles the futures; an exception out of it fails every future it left unsettled. A request
    that awaits each answer before handing in its next item keeps its items in order."""

    def __init__(self, send: Callable[[Batch], Awaitable[None]], name: str) -> None:
        self._send, self._name = send, name
        self._gathered: Batch = []
        self._task: asyncio.Task | None = None

    def submit(self, item: T) -> asyncio.Future:
        """The item's answer, once the batch carrying it is sent."""
        answer = asyncio.get_running_loop().create_future()
        self.put(item, answer)
        return answer

    def put(self, item: T, answer: asyncio.Future | None = None) -> None:
        self._gathered.append((item, answer))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while self._gathered:
            batch, self._gathered = self._gathered, []
            try:
                await self._send(batch)
            except asyncio.CancelledError:
                for _, answer in batch + self._gathered:
                    if answer is not None:
                        answer.cancel()
                self._gathered = []
                raise
            except Exception as e:  # noqa: BLE001 - handed to every waiter of the batch
                fail(batch, e)


def settle(batch: Batch) -> None:
    """Answer every waiter of the batch still waiting (with None)."""
    for _, answer in batch:
        if answer is not None and not answer.done():  # a waiter that was cancelled is done already
            answer.set_result(None)


def fail(batch: Batch, error: BaseException) -> None:
    for _, answer in batch:
        if answer is not None and not answer.done():
            answer.set_exception(error)
