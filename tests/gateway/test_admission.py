"""The bounded admission queue: max_running run, max_queued wait in order, the rest are refused."""

from __future__ import annotations

import asyncio

import pytest

from shardline.gateway.admission import AdmissionQueue
from shardline.gateway.config import AdmissionConfig
from shardline.gateway.errors import ResourceExhausted


def test_limits_order_and_refusal():
    async def main():
        q = AdmissionQueue(AdmissionConfig(max_running=2, max_queued=2))
        a, b = await q.acquire(), await q.acquire()
        order = []

        async def wait(name):
            slot = await q.acquire()
            order.append(name)
            return slot

        c, d = asyncio.create_task(wait("c")), asyncio.create_task(wait("d"))
        await asyncio.sleep(0)
        assert (q.num_running, q.num_queued) == (2, 2)
        with pytest.raises(ResourceExhausted) as e:
            await q.acquire()
        assert "max_running 2" in e.value.message and e.value.retry_after_s > 0
        a.release()
        a.release()  # releasing twice must not free two slots
        slot_c = await c
        assert order == ["c"] and (q.num_running, q.num_queued) == (2, 1), "a freed slot goes to the first waiter"
        b.release()
        slot_d = await d
        slot_c.release()
        slot_d.release()
        assert (q.num_running, q.num_queued) == (0, 0)

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_no_trace():
    async def main():
        q = AdmissionQueue(AdmissionConfig(max_running=1, max_queued=1))
        held = await q.acquire()
        waiter = asyncio.create_task(q.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert q.num_queued == 0, "a waiter that gave up must leave the queue"
        held.release()
        assert q.num_running == 0, "no slot may leak to a waiter that is gone"
        again = await asyncio.wait_for(q.acquire(), 1)
        again.release()

    asyncio.run(main())


def test_zero_queue_refuses_as_soon_as_running_is_full():
    async def main():
        q = AdmissionQueue(AdmissionConfig(max_running=1, max_queued=0))
        slot = await q.acquire()
        with pytest.raises(ResourceExhausted):
            await q.acquire()
        slot.release()

    asyncio.run(main())
