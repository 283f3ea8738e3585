"""Request records in Redis: what happened to each request, and enough to resume it elsewhere.

    shardline:request:{id}            hash: state, model, route, parameters, counts, timestamps, error
    shardline:request:{id}:generated  list: the generated token ids so far, in order

Both expire `record_ttl_s` after the request finishes (and, as a safety net for a gateway that dies
mid-request, `active_record_ttl_s` after it was accepted). Another gateway replica can resume a
request from these two keys alone: prompt_token_ids + sampling (seed included) + generated ids.
Cancel requests for a request owned by another gateway travel on the `shardline:cancel` channel.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from .gathering import Gatherer, settle

KEY_PREFIX = "shardline:request"
CANCEL_CHANNEL = "shardline:cancel"

QUEUED, RUNNING, FINISHED, CANCELLED, FAILED = "QUEUED", "RUNNING", "FINISHED", "CANCELLED", "FAILED"
ACTIVE_STATES = (QUEUED, RUNNING)


def record_key(request_id: str) -> str:
    return f"{KEY_PREFIX}:{request_id}"


def generated_key(request_id: str) -> str:
    return f"{KEY_PREFIX}:{request_id}:generated"


@dataclass
class RequestRecord:
    request_id: str
    model: str
    state: str
    route: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_resumes: int = 0
    queued_at: float = 0.0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    finish_reason: str = ""  # "", "LENGTH", "STOP", "CANCELLED", "ERROR"
    error: str = ""
    gateway_id: str = ""
    generated_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hash(cls, h: dict[str, str], generated: list[str]) -> "RequestRecord":
        return cls(
            request_id=h["request_id"], model=h.get("model", ""), state=h.get("state", ""),
            route=json.loads(h.get("route") or "[]"), params=json.loads(h.get("params") or "{}"),
            num_prompt_tokens=int(h.get("num_prompt_tokens", 0)),
            num_generated_tokens=int(h.get("num_generated_tokens", 0)),
            num_resumes=int(h.get("num_resumes", 0)),
            queued_at=float(h.get("queued_at", 0)), admitted_at=float(h.get("admitted_at", 0)),
            first_token_at=float(h.get("first_token_at", 0)), finished_at=float(h.get("finished_at", 0)),
            finish_reason=h.get("finish_reason", ""), error=h.get("error", ""),
            gateway_id=h.get("gateway_id", ""),
            generated_token_ids=[int(t) for t in generated],
            prompt_token_ids=json.loads(h.get("prompt_token_ids") or "[]"))


class RecordStore:
    """The records' reads and writes. The writes of concurrent requests share round trips: each
    joins the transaction being gathered while the one before is in flight (`_write`)."""

    def __init__(self, client: aioredis.Redis, record_ttl_s: float, active_record_ttl_s: float) -> None:
        self.redis = client
        self.record_ttl_ms = int(record_ttl_s * 1000)
        self.active_ttl_ms = int(active_record_ttl_s * 1000)
        self._writes: Gatherer[Callable[[Pipeline], None]] = Gatherer(self._send_writes, "redis-record-writes")

    async def _write(self, add: Callable[[Pipeline], None]) -> None:
        """Queue `add`'s commands for the next transaction and wait until Redis has applied them.

        A request makes three or more writes (create, running, tokens, finish): sent alone, a burst
        of requests queued up behind their round trips before reaching stage 0 (gathering.py). A
        failed transaction fails every write in it, as the connection error it almost always is
        would."""
        await self._writes.submit(add)

    async def _send_writes(self, batch) -> None:
        async with self.redis.pipeline(transaction=True) as p:
            for add, _ in batch:
                add(p)
            await p.execute()
        settle(batch)

    async def create(self, request_id: str, model: str, params: dict, prompt_token_ids: list[int],
                     gateway_id: str, queued_at: float) -> None:
        """A fresh QUEUED record (replacing a finished one of the same id)."""
        def add(p: Pipeline) -> None:
            p.delete(record_key(request_id), generated_key(request_id))
            p.hset(record_key(request_id), mapping={
                "request_id": request_id, "model": model, "state": QUEUED, "params": json.dumps(params),
                "prompt_token_ids": json.dumps(prompt_token_ids), "num_prompt_tokens": len(prompt_token_ids),
                "num_generated_tokens": 0, "num_resumes": 0, "queued_at": queued_at, "gateway_id": gateway_id,
                "route": "[]"})
            p.pexpire(record_key(request_id), self.active_ttl_ms)

        await self._write(add)

    def running(self, request_id: str, route: list[str], num_resumes: int) -> asyncio.Future:
        """Queued for the next transaction now; the returned future settles once Redis has it. A
        caller need not wait: its later writes queue behind this one, in order."""
        fields = {"state": RUNNING, "route": json.dumps(route), "num_resumes": num_resumes}
        if num_resumes == 0:
            fields["admitted_at"] = time.time()
        return self._writes.submit(lambda p: p.hset(record_key(request_id), mapping=fields))

    async def append_tokens(self, request_id: str, token_ids: list[int], num_generated: int,
                            first_token_at: float | None = None) -> None:
        await self.append_tokens_many([(request_id, token_ids, num_generated, first_token_at)])

    async def append_tokens_many(self, appends: list[tuple[str, list[int], int, float | None]]) -> None:
        """(request id, new ids, ids generated so far, first-token time or None) for any number of
        requests, in one transaction: one round trip however many requests are running."""
        def add(p: Pipeline) -> None:
            for request_id, token_ids, num_generated, first_token_at in appends:
                p.rpush(generated_key(request_id), *token_ids)
                mapping = {"num_generated_tokens": num_generated}
                if first_token_at is not None:
                    mapping["first_token_at"] = first_token_at
                    p.pexpire(generated_key(request_id), self.active_ttl_ms)
                p.hset(record_key(request_id), mapping=mapping)

        await self._write(add)

    async def finish(self, request_id: str, state: str, finish_reason: str, error: str,
                     num_generated: int) -> float:
        """Final state. num_generated trims the id list: after a stop string, ids that arrived past
        the match are not part of the completion."""
        now = time.time()

        def add(p: Pipeline) -> None:
            p.hset(record_key(request_id), mapping={"state": state, "finish_reason": finish_reason,
                                                    "error": error, "finished_at": now,
                                                    "num_generated_tokens": num_generated})
            if num_generated:
                p.ltrim(generated_key(request_id), 0, num_generated - 1)
            else:
                p.delete(generated_key(request_id))  # LTRIM 0 -1 would keep everything
            p.pexpire(record_key(request_id), self.record_ttl_ms)
            p.pexpire(generated_key(request_id), self.record_ttl_ms)

        await self._write(add)
        return now

    async def get(self, request_id: str) -> RequestRecord | None:
        async with self.redis.pipeline(transaction=False) as p:
            p.hgetall(record_key(request_id))
            p.lrange(generated_key(request_id), 0, -1)
            h, generated = await p.execute()
        return RequestRecord.from_hash(h, generated) if h else None

    async def publish_cancel(self, request_id: str) -> None:
        await self.redis.publish(CANCEL_CHANNEL, request_id)
