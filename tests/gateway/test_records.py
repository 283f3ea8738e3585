"""Request records in a real Redis: concurrent requests' writes share transactions, one request's
writes keep their order, and a Redis that fails fails every write waiting on it."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shardline.gateway.records import FINISHED, RUNNING, RecordStore


def exec_calls(stats: dict) -> int:
    return int(stats.get("cmdstat_exec", {}).get("calls", 0))


async def lifecycle(store: RecordStore, rid: str) -> None:
    """One request's writes, each awaited before the next, as the gateway makes them."""
    await store.create(rid, "m", {"max_tokens": 2}, [1, 2, 3], "gw", 1.0)
    await store.running(rid, ["127.0.0.1:7000"], 0)
    await store.append_tokens(rid, [5], 1, first_token_at=2.0)
    await store.append_tokens(rid, [6], 2)
    await store.finish(rid, FINISHED, "LENGTH", "", 2)


def test_concurrent_requests_share_transactions_and_keep_their_own_order(private_redis_server):
    _, url = private_redis_server

    async def run() -> tuple[int, list]:
        client = aioredis.from_url(url, decode_responses=True)
        store = RecordStore(client, record_ttl_s=60, active_record_ttl_s=600)
        before = exec_calls(await client.info("commandstats"))
        await asyncio.gather(*(lifecycle(store, f"r{i}") for i in range(32)))
        transactions = exec_calls(await client.info("commandstats")) - before
        records = [await store.get(f"r{i}") for i in range(32)]
        await client.aclose()
        return transactions, records

    transactions, records = asyncio.run(run())
    for i, r in enumerate(records):
        assert (r.state, r.finish_reason, r.generated_token_ids, r.route, r.first_token_at) == \
            (FINISHED, "LENGTH", [5, 6], ["127.0.0.1:7000"], 2.0), f"request r{i}: {r}"
    # 32 requests x 5 writes alone would be 160 transactions.
    assert transactions < 32 * 5 / 4, f"{transactions} transactions for 160 writes: they were not shared"


def test_a_lone_write_is_sent_at_once(private_redis_server):
    _, url = private_redis_server

    async def run():
        client = aioredis.from_url(url, decode_responses=True)
        store = RecordStore(client, record_ttl_s=60, active_record_ttl_s=600)
        await store.create("solo", "m", {}, [1], "gw", 1.0)
        await asyncio.wait_for(store.running("solo", ["a:1"], 0), timeout=1.0)
        record = await store.get("solo")
        await client.aclose()
        return record

    assert asyncio.run(run()).state == RUNNING


def test_a_failed_transaction_fails_every_write_in_it(private_redis_server):
    proc, url = private_redis_server

    async def run() -> list:
        client = aioredis.from_url(url, decode_responses=True, socket_timeout=1.0)
        store = RecordStore(client, record_ttl_s=60, active_record_ttl_s=600)
        await store.create("warm", "m", {}, [1], "gw", 1.0)  # the connection exists before the kill
        proc.kill()
        proc.wait()
        results = await asyncio.gather(*(store.running(f"r{i}", ["a:1"], 0) for i in range(8)),
                                       return_exceptions=True)
        await client.aclose()
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, (RedisConnectionError, OSError)) for r in results), results
