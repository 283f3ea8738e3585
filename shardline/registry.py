"""The replica registry in Redis: who serves which stage of which model, and how loaded it is.

Each stage-worker replica keeps one key alive:

    shardline:replica:{model}:{stage}:{replica_id}  ->  JSON ReplicaInfo, expiring after `ttl`

and refreshes it every heartbeat. A replica that dies simply stops refreshing and vanishes after
`ttl` seconds; one that shuts down deletes its key. Nothing else needs to be told: a pod added by
`kubectl scale` is routable from its first heartbeat (sent once it is ready).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields

import redis

KEY_PREFIX = "shardline:replica"


@dataclass
class ReplicaInfo:
    replica_id: str
    address: str  # host:port of the replica's TP rank 0
    model: str
    stage: int
    num_stages: int
    layer_start: int
    layer_end: int
    tp: int
    num_total_blocks: int
    num_free_blocks: int
    block_size: int
    num_running: int = 0
    is_draining: bool = False
    updated_at: float = field(default_factory=time.time)

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}:{self.model}:{self.stage}:{self.replica_id}"

    @classmethod
    def from_json(cls, text: str) -> "ReplicaInfo":
        """A registry entry; keys this version does not know are left out, so that a replica of a
        later version that reports more (mid-rollout) is still routed to."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


class Registry:
    def __init__(self, client: redis.Redis, ttl_s: float = 5.0) -> None:
        self.redis, self.ttl_s = client, ttl_s

    @classmethod
    def from_url(cls, url: str, ttl_s: float = 5.0, timeout_s: float = 2.0) -> "Registry":
        """timeout_s: a command or connect that takes longer raises redis.TimeoutError instead of
        hanging the heartbeat or the gateway's poll on a Redis that stopped answering."""
        return cls(redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                        socket_connect_timeout=timeout_s), ttl_s)

    def heartbeat(self, info: ReplicaInfo) -> None:
        """Register or refresh; the key expires if no heartbeat follows within ttl."""
        info.updated_at = time.time()
        self.redis.set(info.key, json.dumps(asdict(info)), px=int(self.ttl_s * 1000))

    register = heartbeat

    def deregister(self, info: ReplicaInfo) -> None:
        self.redis.delete(info.key)

    def replicas(self, model: str | None = None, stage: int | None = None) -> list[ReplicaInfo]:
        pattern = f"{KEY_PREFIX}:{model or '*'}:{'*' if stage is None else stage}:*"
        keys = sorted(self.redis.scan_iter(match=pattern, count=500))
        if not keys:
            return []
        return [ReplicaInfo.from_json(v) for v in self.redis.mget(keys) if v is not None]

    def models(self) -> dict[str, int]:
        """Model name -> number of pipeline stages, over live replicas."""
        return {r.model: r.num_stages for r in self.replicas()}
